-- The states counter, and the workers whose state changed since a count a reader knows.
-- KEYS[1]  the states counter (P:states)
-- KEYS[2]  the states log stream ({P:states}:log)
-- ARGV[1]  the count the reader knows
-- ARGV[2]  the most log entries worth reading (beyond them, reading every worker is as cheap)
-- Returns {counter}, then the log's newest (counter - known) entries if that is between 1
-- and ARGV[2] ({id, {'n', count, 'w', worker}} each). The reader checks that they are the
-- counts after its own, one each: a writer that INCRs without logging (an older kvsi), or a
-- log trimmed past them, leaves one out, and it reads every worker's state instead.
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = n - tonumber(ARGV[1])
if want < 1 or want > tonumber(ARGV[2]) then
  return {n}
end
return {n, redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', want)}
