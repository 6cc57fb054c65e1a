-- Counts the entries of stream KEYS[1] after ARGV[1] (an exclusive start, `(ID`), at most
-- ARGV[2] of them, inside Redis: only the count crosses the network.
return #redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
