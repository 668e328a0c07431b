-- A worker's state or detail changed (status.lua said so): count it, and log which worker,
-- so readers read that worker's state again, not every worker's.
-- KEYS[1]  the states counter (P:states)
-- KEYS[2]  the states log stream ({P:states}:log: the counter's slot)
-- ARGV[1]  the worker (`pod/rank`)
-- ARGV[2]  the log's length bound (XADD MAXLEN ~)
-- Returns the counter after.
local n = redis.call('INCR', KEYS[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'n', n, 'w', ARGV[1])
return n
