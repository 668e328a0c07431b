-- Where one session is, in one call, reading only the workers its directory names
-- (standalone servers; a cluster's keys span slots, so it reads them in two pipelines).
-- KEYS[1]  the retired record (sorted set: session id -> -last_seen)
-- KEYS[2]  the session's directory set (`<pod>/<rank>` -> when its writer asserted it)
-- ARGV[1]  the session id
-- ARGV[2]  the key prefix (a worker's keys are `<prefix>:{<pod>/<rank>}:<name>`)
-- ARGV[3]  the prune time: a directory entry asserted before it whose worker holds no
--          residency of the session is dropped (its write never landed, or the residency
--          is gone); a newer one may announce a write still in flight and stays
-- Returns {retired score or "", then member, residency, parts for each worker holding a
-- residency of the session}. The residency value starts with the session's last store on
-- the worker. `parts` is the worker's parts hash (HGETALL: pid, "<group>|<medium>", ...)
-- when the residency holds blocks (it then holds a space), else empty. The worker keys are
-- named here from the directory's members (store/README.md "Redis: keys a script names
-- itself"): a standalone server has no slots to cross.
local sid, prefix, prune = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {redis.call('ZSCORE', KEYS[1], sid) or ''}
local none = {}
local hinted = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #hinted, 2 do
  local w = hinted[i]
  local base = prefix .. ':{' .. w .. '}:'
  local res = redis.call('HGET', base .. 'res', sid)
  if res then
    local parts = none
    if string.find(res, ' ', 1, true) then
      parts = redis.call('HGETALL', base .. 'parts')
    end
    out[#out + 1] = w
    out[#out + 1] = res
    out[#out + 1] = parts
  elseif tonumber(hinted[i + 1]) < prune then
    redis.call('ZREM', KEYS[2], w)
  end
end
return out
