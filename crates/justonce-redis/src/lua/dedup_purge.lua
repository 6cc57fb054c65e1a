-- Deletes, of the dedup keys KEYS[1..n], those recorded at least ARGV[1] ms ago by the
-- server's clock. Answers how many it deleted.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now_ms - tonumber(ARGV[1])
local n = 0
for i = 1, #KEYS do
  local at = redis.call('HGET', KEYS[i], 'at')
  if at and tonumber(at) <= cutoff then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
