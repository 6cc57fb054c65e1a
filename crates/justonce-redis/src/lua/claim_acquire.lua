-- Takes the claims of KEYS[2..n] (the messages of a batch) for one call of `acquire_batch`,
-- in one round trip, and answers per key with what it found:
--   {'acquired', fence} | {'held', ms left on the lease} | {'done', result or nil}
--   | {'conflict', the stored fingerprint}
-- KEYS[1]: the last fence issued. ARGV[1]: the lease in ms; ARGV[2]: how long a held key
-- outlives its lease, in ms; ARGV[3]: the call's owner nonce (the same on its retry);
-- ARGV[4..]: the payload fingerprints, one per key.
--
-- A fence is max(last + 1, the server's clock in microseconds): it grows within a run, and
-- after a restart that lost every key the clock has moved past every fence issued before.
-- Numbers stay below 2^53, exact in Lua's doubles, and travel as decimal strings.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local lease, keep, owner = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local issued = false
local seen = {}
local out = {}
for i = 2, #KEYS do
  local key, fp = KEYS[i], ARGV[i + 2]
  local h = redis.call('HMGET', key, 'state', 'fence', 'until', 'fp', 'result', 'owner')
  local state, until_ms = h[1], tonumber(h[3] or '0')
  if state == 'done' then
    if h[4] == fp then
      out[#out + 1] = {'done', h[5]}
    else
      out[#out + 1] = {'conflict', h[4]}
    end
  elseif state == 'held' and h[6] == owner and not seen[key] then
    -- This call ran before and its reply was lost: the claim is the caller's.
    out[#out + 1] = {'acquired', h[2]}
  elseif state == 'held' and until_ms > now_ms then
    out[#out + 1] = {'held', string.format('%.0f', until_ms - now_ms)}
  else
    -- Free, released, or its lease ran out: a new holder, with a higher fence.
    fence = math.max(fence + 1, now_us)
    issued = true
    local f = string.format('%.0f', fence)
    redis.call('HSET', key, 'state', 'held', 'fence', f, 'until',
      string.format('%.0f', now_ms + lease), 'fp', fp, 'owner', owner)
    redis.call('HDEL', key, 'result', 'done_at')
    redis.call('PEXPIRE', key, lease + keep)
    out[#out + 1] = {'acquired', f}
  end
  seen[key] = true
end
if issued then
  redis.call('SET', KEYS[1], string.format('%.0f', fence))
end
return out
