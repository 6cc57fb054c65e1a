-- Deletes, of the claim keys KEYS[1..n], those completed at least ARGV[1] ms ago by the
-- server's clock; never one in progress. Answers how many it deleted.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now_ms - tonumber(ARGV[1])
local n = 0
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'state', 'done_at')
  if h[1] == 'done' and tonumber(h[2] or '0') <= cutoff then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
