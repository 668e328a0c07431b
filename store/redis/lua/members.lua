-- Every member of each set in KEYS, in one reply: a writer loads a worker's sets with a few
-- calls instead of one command per set (store/redis/store.py `_load`).
-- KEYS  sets of one worker (one hash tag, one slot)
-- Returns one array of members per key, in KEYS order (empty for a missing key).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('SMEMBERS', KEYS[i])
end
return out
