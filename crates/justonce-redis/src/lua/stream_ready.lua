-- What a receive takes without waiting, in one round trip, up to ARGV[4] entries:
--   1. retries whose delay is over, moved from the delayed set into the retry stream;
--   2. on a first receive (ARGV[5] = '1'), this consumer's own pending entries: a worker
--      restarted under its name takes its work back at once, not after a lease;
--   3. entries of either stream idle past the lease (ARGV[3] ms): their holder died or
--      stalled (a live holder's heartbeat keeps its entries fresh);
--   4. new retry copies.
-- New entries of the main stream are read by the caller, with a plain XREADGROUP whose
-- reply goes to it as it is (through a script, each entry is made a Lua table and back).
-- KEYS: main stream, retry stream, delayed set. ARGV[1]: group; ARGV[2]: consumer.
-- Answers {entries, ms until the next delayed retry is due or -1}; an entry is
-- {'m' or 'r', id, delivery count, {field, value, ...}}; a pending entry deleted from its
-- stream comes as {tag, id, count, false} (acked here).
local group, me = ARGV[1], ARGV[2]
local lease, max = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local main, retry, delayed = KEYS[1], KEYS[2], KEYS[3]

for _, m in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, 100)) do
  redis.call('XADD', retry, '*', unpack(cmsgpack.unpack(m)))
  redis.call('ZREM', delayed, m)
end

local out = {}
local function tag_of(key)
  if key == main then return 'm' end
  return 'r'
end
local function count_of(key, id)
  local p = redis.call('XPENDING', key, group, id, id, 1)
  if p[1] then return p[1][4] end
  return 1
end
local function add(key, id, count, fields)
  if not fields then
    redis.call('XACK', key, group, id)
    return
  end
  out[#out + 1] = {tag_of(key), id, tostring(count), fields}
end

if ARGV[5] == '1' then
  for _, key in ipairs({main, retry}) do
    if #out < max then
      local r = redis.call('XREADGROUP', 'GROUP', group, me, 'COUNT', max - #out,
        'STREAMS', key, '0')
      if r and r[1] then
        for _, e in ipairs(r[1][2]) do
          add(key, e[1], count_of(key, e[1]), e[2])
        end
      end
    end
  end
end

for _, key in ipairs({main, retry}) do
  if #out < max then
    local r = redis.call('XAUTOCLAIM', key, group, me, lease, '0-0', 'COUNT', max - #out)
    for _, e in ipairs(r[2]) do
      add(key, e[1], count_of(key, e[1]), e[2])
    end
  end
end

if #out < max then
  local r = redis.call('XREADGROUP', 'GROUP', group, me, 'COUNT', max - #out,
    'STREAMS', retry, '>')
  if r and r[1] then
    for _, e in ipairs(r[1][2]) do
      add(retry, e[1], 1, e[2])
    end
  end
end

local next_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local wait = -1
if next_due[2] then
  wait = math.max(0, tonumber(next_due[2]) - now)
end
return {out, string.format('%.0f', wait)}
