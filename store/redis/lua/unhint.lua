-- Drop a worker from a session's directory set if its entry is no newer than a time: the
-- writer asserting the worker again meanwhile (a fresher score) keeps it.
-- KEYS[1]  the session's directory set (`P:dir:<session id>`)
-- ARGV[1]  the worker's member (`<pod>/<rank>`)
-- ARGV[2]  the newest score that may go
-- Returns 1 if dropped, else 0.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
