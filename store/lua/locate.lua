-- Where one session is, in one call (standalone servers: a cluster's workers span slots, so
-- it reads them with one pipeline per node instead).
-- KEYS[1]      the retired record (sorted set: session id -> -last_seen)
-- KEYS[2i]     worker i's seen sorted set, KEYS[2i+1] its residency hash (i = 1..n)
-- ARGV[1]      the session id
-- Returns {retired score or "", then i, score or "", residency or "" for each worker i that
-- has a score or a residency}: one reply however many workers, instead of two per worker.
local sid = ARGV[1]
local out = {redis.call('ZSCORE', KEYS[1], sid) or ''}
for i = 1, (#KEYS - 1) / 2 do
  local score = redis.call('ZSCORE', KEYS[2 * i], sid)
  local res = redis.call('HGET', KEYS[2 * i + 1], sid)
  if score or res then
    out[#out + 1] = i
    out[#out + 1] = score or ''
    out[#out + 1] = res or ''
  end
end
return out
