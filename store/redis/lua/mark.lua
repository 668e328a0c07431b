-- Set fields of a worker's meta only if the worker exists: a mark written while another
-- process removes the worker must not leave a meta behind (a worker with a meta is taken
-- as registered by a writer's load).
-- KEYS[1]  the worker's meta hash
-- ARGV     field, value, ...
-- Returns 1 if written, else 0.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
  return 1
end
return 0
