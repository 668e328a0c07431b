-- Renew one central replica's record (or drop it: a clean stop) and answer who is live, on
-- the server's clock (the replicas' clocks need not agree), with the epoch of that live set.
-- KEYS[1]  the roster: a sorted set, replica id -> when its record runs out (ms)
-- KEYS[2]  the roster's epoch (same slot): set anew whenever the live set changes, to the
--          server's time in ms or one more than before, whichever is greater, so a later set
--          has a greater epoch even after the key was lost
-- ARGV[1]  the replica's id
-- ARGV[2]  its TTL in milliseconds, or "" to drop its record (`leave`)
-- ARGV[3]  the latest epoch this replica was answered, or "": a stored epoch below it was
--          lost with the server's last writes (a failover to a replica behind), and is
--          set anew as if the live set had changed
-- Returns {epoch, {ids of the live replicas (records not run out), in id order}}.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local changed
if ARGV[2] == '' then
  changed = redis.call('ZREM', KEYS[1], ARGV[1])
else
  changed = redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
end
changed = changed + redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
local epoch = tonumber(redis.call('GET', KEYS[2]))
local seen = tonumber(ARGV[3])
if changed > 0 or not epoch or (seen and epoch < seen) then
  epoch = math.max((epoch or 0) + 1, ms, (seen or 0) + 1)
  redis.call('SET', KEYS[2], epoch)
end
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(live)
return {epoch, live}
