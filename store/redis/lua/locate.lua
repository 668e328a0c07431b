-- Where one session is, in one call (standalone servers: a cluster's workers span slots, so
-- it reads them with one pipeline per node instead).
-- KEYS[1]      the retired record (sorted set: session id -> -last_seen)
-- KEYS[1 + i]  worker i's residency hash (i = 1..n)
-- ARGV[1]      the session id
-- Returns {retired score or "", then i, residency, parts for each worker i holding a
-- residency of the session}: one reply however many workers. The residency value starts
-- with the session's last store on the worker, the time its seen set holds too (apply.lua
-- writes both, expire.lua and worker removal drop both), so the seen sets are not read:
-- one command per worker, not two. `parts` is the worker's parts hash (HGETALL: pid,
-- "<group>|<medium>", ...) when the residency holds blocks (it then holds a space), else
-- empty: what names the media of its counts, without a second round. The parts hash is not
-- declared: its name is the residency hash's with `parts` for `res` (store/redis/layout.py),
-- a key of the same worker, so of the same hash slot.
local sid = ARGV[1]
local out = {redis.call('ZSCORE', KEYS[1], sid) or ''}
local none = {}
for i = 2, #KEYS do
  local res = redis.call('HGET', KEYS[i], sid)
  if res then
    local parts = none
    if string.find(res, ' ', 1, true) then
      parts = redis.call('HGETALL', string.sub(KEYS[i], 1, -4) .. 'parts')
    end
    out[#out + 1] = i - 1
    out[#out + 1] = res
    out[#out + 1] = parts
  end
end
return out
