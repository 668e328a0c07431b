-- The states counter, and the log of which workers it moved for since a count a reader knows.
-- KEYS[1]  the states counter (P:states)
-- KEYS[2]  the states log stream ({P:states}:log)
-- ARGV[1]  the count the reader's values are up to, or "" (it reads every worker's now)
-- ARGV[2]  the most moves worth reading (beyond them, reading every worker is as cheap)
-- Returns {counter, entries}, entries newest first ({id, {'n', count, 'w', worker}} each):
-- with a count, the log's newest (counter - count + 1), the entry of the count itself last,
-- if counter - count is between 0 and ARGV[2] (else none); without, the newest entry. The
-- reader checks that the last is the very entry it saw for its count (same id) and that the
-- others are the counts after it, one each: a writer that INCRs without logging (an older
-- kvsi), a log trimmed past them, or a counter that went back (a Redis that lost its newest
-- writes) leaves one out or changes an id, and it reads every worker's again instead.
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = 1
if ARGV[1] ~= '' then
  want = n - tonumber(ARGV[1]) + 1
  if want < 1 or want > tonumber(ARGV[2]) + 1 then
    return {n, {}}
  end
end
return {n, redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', want)}
