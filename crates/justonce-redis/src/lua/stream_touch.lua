-- A heartbeat: resets the idle time of the entries this consumer still holds (receipts:
-- tag, id, delivery count, from ARGV[3]), so that no other consumer takes them over while
-- a long batch runs. XCLAIM with JUSTID moves no delivery count. KEYS: main, retry
-- streams; ARGV[1]: group; ARGV[2]: consumer. Answers how many it touched.
local group, me = ARGV[1], ARGV[2]
local n = 0
for i = 3, #ARGV, 3 do
  local key = KEYS[2]
  if ARGV[i] == 'm' then key = KEYS[1] end
  local id, count = ARGV[i + 1], ARGV[i + 2]
  local p = redis.call('XPENDING', key, group, id, id, 1)
  if p[1] ~= nil and p[1][2] == me and tostring(p[1][4]) == count then
    redis.call('XCLAIM', key, group, me, 0, id, 'JUSTID')
    n = n + 1
  end
end
return n
