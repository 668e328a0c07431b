-- Forget one worker's (or the retired) records of idle sessions holding no block there.
-- KEYS[1]    the worker's seen sorted set (session id -> -last_seen)
-- KEYS[2]    the worker's residency hash (session id -> "<last_seen> <part>:<count> ...");
--            absent for the retired record (sessions of removed workers), a sorted set only
-- ARGV[1]    -older_than: a session qualifies only if its score is above it (or absent)
-- ARGV[2..]  session ids the caller found idle on every worker
-- Checks again here, atomically, so a session stored since the caller looked is kept.
-- Returns the ids kept (stored since): the caller counts a session forgotten only if no
-- worker kept it.
local kept = {}
local threshold = tonumber(ARGV[1])
for i = 2, #ARGV do
  local sid = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], sid)
  local res = KEYS[2] and redis.call('HGET', KEYS[2], sid)
  if (not score or tonumber(score) > threshold) and (not res or not string.find(res, ' ')) then
    redis.call('ZREM', KEYS[1], sid)
    if KEYS[2] then
      redis.call('HDEL', KEYS[2], sid)
    end
  else
    kept[#kept + 1] = sid
  end
end
return kept
