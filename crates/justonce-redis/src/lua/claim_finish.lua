-- Completes or releases the claims KEYS[1..n], each only if its fence still holds it.
-- ARGV[1]: how long a completed key is kept, in ms; then three per key: the fence, the
-- operation ('c' complete with a result, 'n' complete without one, 'r' release) and the
-- result. Answers per key 'ok', or the fence that holds the key now ('' when none): a
-- completion by a fence that no longer holds the claim is refused. A completion repeated
-- by the same fence (its first reply was lost) is 'ok' again; a release by a fence that
-- does not hold the claim does nothing.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local fence, op, result = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local h = redis.call('HMGET', key, 'state', 'fence')
  if op == 'r' then
    if h[1] == 'held' and h[2] == fence then
      redis.call('HSET', key, 'state', 'released')
      redis.call('HDEL', key, 'until', 'owner')
    end
    out[i] = 'ok'
  elseif h[2] == fence and h[1] == 'held' then
    redis.call('HSET', key, 'state', 'done', 'done_at', string.format('%.0f', now_ms))
    if op == 'c' then
      redis.call('HSET', key, 'result', result)
    end
    redis.call('HDEL', key, 'until', 'owner')
    redis.call('PEXPIRE', key, keep)
    out[i] = 'ok'
  elseif h[2] == fence and h[1] == 'done' then
    out[i] = 'ok'
  else
    out[i] = h[2] or ''
  end
end
return out
