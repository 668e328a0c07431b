-- A guarded write to one worker in one script: check.lua's checks, then plain writes.
-- KEYS, ARGV[1..6] and the reply: as check.lua's; a refused write writes nothing.
-- KEYS[3..]  further keys of the same worker, taken in order by the ops; on a standalone
--            server also the directories' sets a write asserts (store/README.md "Redis:
--            directories"), which only a server without slots lets one script write
-- ARGV[7..]  ops, each: code, count, args... (store/redis/plan.py): an op takes the next
--            key and `count` args, or for DEL/SUNIONSTORE the next `count` keys, or for S
--            (one SREM of one member per key) the next `count` keys and `count` args, one
--            each. An XADD op (the change feed's record) runs only here, after the checks: a
--            duplicate or stale call adds nothing, so each applied batch is in the feed once.
--            The entry index's buckets are plain SADDs and SREMs the writer groups itself.
-- The same ops also run as plain commands of a transaction guarded by guard.lua
-- (store/redis/transport.py), as plan.commands renders them.
local refused, outcome, ver = check()
if refused then
  return refused
end
local CMD = {
  a = 'SADD', r = 'SREM', d = 'DEL', h = 'HSET', n = 'HSETNX', H = 'HDEL',
  z = 'ZADD', Z = 'ZREM', u = 'SUNIONSTORE', l = 'LPUSH', t = 'LTRIM', x = 'XADD',
  e = 'EXPIRE',
}
local i, k, n = 7, 3, #ARGV
while i <= n do
  local code, count = ARGV[i], tonumber(ARGV[i + 1])
  if code == 'S' then
    for j = 0, count - 1 do
      redis.call('SREM', KEYS[k + j], ARGV[i + 2 + j])
    end
    k = k + count
    i = i + 2 + count
  elseif code == 'd' or code == 'u' then
    redis.call(CMD[code], unpack(KEYS, k, k + count - 1))
    k = k + count
    i = i + 2
  else
    redis.call(CMD[code], KEYS[k], unpack(ARGV, i + 2, i + 1 + count))
    k = k + 1
    i = i + 2 + count
  end
end
return {outcome, ver, '', ''}
