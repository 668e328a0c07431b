-- Renew one central replica's record and answer who is live, on the server's clock (the
-- replicas' clocks need not agree).
-- KEYS[1]  the roster: a sorted set, replica id -> when its record runs out (ms)
-- ARGV[1]  the replica's id
-- ARGV[2]  its TTL in milliseconds
-- Returns the ids of the live replicas (records not run out), in id order.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(live)
return live
