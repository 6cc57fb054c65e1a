#!lua
-- Commits a batch: its dedup records and its handlers' writes, all or nothing.
-- KEYS: the dedup keys to record. ARGV[1]: their expiry in ms; ARGV[2..#KEYS+1]: their
-- payload fingerprints; then four per write: op, key, a, b (see `Write` in store.rs).
--
-- Nothing is written unless all of this holds, checked first: every dedup key is still
-- absent (a concurrent batch may have committed one since it was read: answer
-- {'taken', key}), and every write can run (its key holds the type it writes, or nothing;
-- an increment meets an integer: answer {'refused', write index, why}). A Redis script
-- keeps the writes it made before a command fails, so the checks come first. The shebang
-- makes the server refuse the whole script when it is out of memory, before any write.
local expiry = tonumber(ARGV[1])
local n = #KEYS
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {'taken', KEYS[i]}
  end
end
local first = n + 2
local writes = (#ARGV - first + 1) / 4
-- Types as the writes before leave them, so `del k` then `rpush k` is allowed.
local types = {}
local function type_of(key)
  if types[key] == nil then
    types[key] = redis.call('TYPE', key)['ok']
  end
  return types[key]
end
local function integer(v)
  return v == false or string.match(v, '^%-?%d+$') ~= nil
end
local want = {hincrby = 'hash', hset = 'hash', incrby = 'string', rpush = 'list',
              sadd = 'set', zadd = 'zset'}
for w = 0, writes - 1 do
  local op, key, a = ARGV[first + 4 * w], ARGV[first + 4 * w + 1], ARGV[first + 4 * w + 2]
  local t = type_of(key)
  local need = want[op]
  if need ~= nil and t ~= 'none' and t ~= need then
    return {'refused', tostring(w), op .. ' on ' .. key .. ', which holds a ' .. t}
  end
  if op == 'hincrby' and not integer(redis.call('HGET', key, a)) then
    return {'refused', tostring(w), 'hincrby on ' .. key .. ' ' .. a .. ', which is not an integer'}
  end
  if op == 'incrby' and t ~= 'none' and not integer(redis.call('GET', key)) then
    return {'refused', tostring(w), 'incrby on ' .. key .. ', which is not an integer'}
  end
  if op == 'del' then
    types[key] = 'none'
  elseif op == 'set' then
    types[key] = 'string'
  elseif need ~= nil then
    types[key] = need
  end
end
for w = 0, writes - 1 do
  local op, key = ARGV[first + 4 * w], ARGV[first + 4 * w + 1]
  local a, b = ARGV[first + 4 * w + 2], ARGV[first + 4 * w + 3]
  if op == 'hincrby' then
    redis.call('HINCRBY', key, a, b)
  elseif op == 'hset' then
    redis.call('HSET', key, a, b)
  elseif op == 'incrby' then
    redis.call('INCRBY', key, a)
  elseif op == 'set' then
    if b == '' then redis.call('SET', key, a) else redis.call('SET', key, a, 'PX', b) end
  elseif op == 'rpush' then
    redis.call('RPUSH', key, a)
  elseif op == 'sadd' then
    redis.call('SADD', key, a)
  elseif op == 'zadd' then
    redis.call('ZADD', key, a, b)
  elseif op == 'del' then
    redis.call('DEL', key)
  elseif op == 'pexpire' then
    redis.call('PEXPIRE', key, a)
  end
end
local t = redis.call('TIME')
local now_ms = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
for i = 1, n do
  redis.call('HSET', KEYS[i], 'fp', ARGV[i + 1], 'at', now_ms)
  redis.call('PEXPIRE', KEYS[i], expiry)
end
return {'ok'}
