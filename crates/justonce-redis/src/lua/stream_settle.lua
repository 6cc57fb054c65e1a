-- Settles deliveries, each only while this consumer still holds it with the same delivery
-- count (its receipt): a receipt whose entry went to another consumer, or came back to
-- this one since, settles nothing.
-- KEYS: main stream, retry stream, delayed set, dead-letter stream.
-- ARGV[1]: group; ARGV[2]: consumer; ARGV[3]: 'ack', 'nack', 'release' or 'dead';
-- ARGV[4]: the delay in ms (nack); ARGV[5]: the attempts the copy carries ('att');
-- ARGV[6]: n, then n field/value pairs added to a dead letter; then the smallest and the
-- largest receipt id of the main stream, then of the retry stream (the client compares
-- them: parsing ids in Lua took most of the script's time); then per receipt: tag ('m' or
-- 'r'), entry id, delivery count.
-- A nack or release acks the entry and writes a copy with `att` into the retry stream,
-- or, with a delay, into the delayed set; the main stream is only ever acked (other groups
-- may read it). A dead letter is a copy in the dead-letter stream with the reason, and the
-- entry acked, in the same script. Retry copies are deleted once settled. Answers how many
-- receipts still held their entry.
local group, me, op = ARGV[1], ARGV[2], ARGV[3]
local delay, att = tonumber(ARGV[4]), ARGV[5]
local n = tonumber(ARGV[6])
local reason = {}
for i = 1, 2 * n do
  reason[i] = ARGV[6 + i]
end
local bounds = {}
bounds[KEYS[1]] = { ARGV[7 + 2 * n], ARGV[8 + 2 * n] }
bounds[KEYS[2]] = { ARGV[9 + 2 * n], ARGV[10 + 2 * n] }
local first = 11 + 2 * n
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function key_of(tag)
  if tag == 'm' then return KEYS[1] end
  return KEYS[2]
end
-- The delivery counts of this consumer's pending entries between the smallest and the
-- largest id of the receipts, per stream: one XPENDING instead of one per receipt.
-- An answer that came back full may have left some out; those are asked one by one.
local known, full = {}, {}
local function load(key, ids)
  local lo, hi = bounds[key][1], bounds[key][2]
  local cap = 4 * #ids + 100
  local rows = redis.call('XPENDING', key, group, lo, hi, cap, me)
  local m = {}
  for _, r in ipairs(rows) do m[r[1]] = tostring(r[4]) end
  known[key], full[key] = m, #rows >= cap
end
local function holds(key, id, count)
  local m = known[key]
  if m and m[id] then return m[id] == count end
  if m and not full[key] then return false end
  local p = redis.call('XPENDING', key, group, id, id, 1)
  return p[1] ~= nil and p[1][2] == me and tostring(p[1][4]) == count
end
local function fields_of(key, id)
  local r = redis.call('XRANGE', key, id, id)
  if not r[1] then return nil end
  local f = {}
  local raw = r[1][2]
  for i = 1, #raw, 2 do
    if raw[i] ~= 'att' and raw[i] ~= 'src' then
      f[#f + 1] = raw[i]
      f[#f + 1] = raw[i + 1]
    end
  end
  return f
end

local per_key = {}
for i = first, #ARGV, 3 do
  local key = key_of(ARGV[i])
  per_key[key] = per_key[key] or {}
  table.insert(per_key[key], ARGV[i + 1])
end
for key, ids in pairs(per_key) do load(key, ids) end

local settled = 0
-- Acks of the main stream gathered for one XACK per thousand entries.
local acks = {}
for i = first, #ARGV, 3 do
  local tag, id, count = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local key = key_of(tag)
  if holds(key, id, count) then
    if op ~= 'ack' then
      local f = fields_of(key, id)
      if f then
        f[#f + 1] = 'src'
        f[#f + 1] = tag .. ':' .. id
        if op == 'dead' then
          for j = 1, #reason do f[#f + 1] = reason[j] end
          f[#f + 1] = 'dl_at'
          f[#f + 1] = string.format('%.0f', now)
          redis.call('XADD', KEYS[4], '*', unpack(f))
        else
          f[#f + 1] = 'att'
          f[#f + 1] = att
          if delay > 0 then
            redis.call('ZADD', KEYS[3], now + delay, cmsgpack.pack(f))
          else
            redis.call('XADD', KEYS[2], '*', unpack(f))
          end
        end
      end
    end
    if tag == 'r' then
      redis.call('XACK', key, group, id)
      redis.call('XDEL', key, id)
    else
      acks[#acks + 1] = id
    end
    settled = settled + 1
  end
end
for j = 1, #acks, 1000 do
  redis.call('XACK', KEYS[1], group, unpack(acks, j, math.min(j + 999, #acks)))
end
return settled
