-- Where one session is, in one call (standalone servers: a cluster's workers span slots, so
-- it reads them with one pipeline per node instead).
-- KEYS[1]      the retired record (sorted set: session id -> -last_seen)
-- KEYS[2i]     worker i's seen sorted set, KEYS[2i+1] its residency hash (i = 1..n)
-- ARGV[1]      the session id
-- Returns {retired score or "", then i, score or "", residency or "", parts for each worker i
-- that has a score or a residency}: one reply however many workers, instead of two per
-- worker. `parts` is the worker's parts hash (HGETALL: pid, "<group>|<medium>", ...) when
-- the residency holds blocks (it then holds a space), else empty: what names the media of
-- its counts, without a second round. The parts hash is not declared: its name is the seen
-- set's with `parts` for `seen` (store/redis_layout.py), a key of the same worker, so of the
-- same hash slot.
local sid = ARGV[1]
local out = {redis.call('ZSCORE', KEYS[1], sid) or ''}
local none = {}
for i = 1, (#KEYS - 1) / 2 do
  local score = redis.call('ZSCORE', KEYS[2 * i], sid)
  local res = redis.call('HGET', KEYS[2 * i + 1], sid)
  if score or res then
    local parts = none
    if res and string.find(res, ' ', 1, true) then
      parts = redis.call('HGETALL', string.sub(KEYS[2 * i], 1, -5) .. 'parts')
    end
    out[#out + 1] = i
    out[#out + 1] = score or ''
    out[#out + 1] = res or ''
    out[#out + 1] = parts
  end
end
return out
