-- Trims the main stream KEYS[1] below what every consumer group still needs: the smallest
-- of each group's first pending entry, or the entry after its last delivered one. A
-- pending entry, or one not yet delivered to some group, is never removed. Answers how
-- many entries went.
-- parse and less: stream_ids.lua, prepended.
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return 0 end
local minid = nil
for _, g in ipairs(groups) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local summary = redis.call('XPENDING', KEYS[1], name)
  local need = summary[2]
  if not need then
    local ms, seq = parse(last)
    need = string.format('%.0f-%.0f', ms, seq + 1)
  end
  if minid == nil or less(need, minid) then minid = need end
end
return redis.call('XTRIM', KEYS[1], 'MINID', minid)
