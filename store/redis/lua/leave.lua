-- A central replica's clean stop: its record goes, and the live set has a new epoch.
-- KEYS[1]  the roster (roster.lua); KEYS[2] its epoch (roster.lua's rule)
-- ARGV[1]  the replica's id
-- Returns 1 if the record was there, else 0.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('SET', KEYS[2], math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, ms))
return 1
