-- Prepended to the stream scripts that compare entry ids (settle, trim).
-- Entry ids compared as (ms, seq): as strings, '9-0' would sort after '10-0'.
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
