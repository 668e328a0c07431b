-- The run of a prompt's blocks, from the first, that one worker holds, and in which media.
-- KEYS[1]    the worker's parts hash (pid -> "<group>|<medium>"; pids are 0..n-1)
-- KEYS[2..]  entry-index buckets: the one for pid p and the prompt's j-th distinct bucket
--            (1-based) is KEYS[1 + p * nb + j], for p below ARGV[1]
-- ARGV[1]    how many parts the caller declared buckets for
-- ARGV[2]    nb, the number of distinct buckets declared per part
-- ARGV[3..]  per block, in prompt order: its set member, its bucket's index j
-- Returns {n, matched}: n the worker's part count, matched one list of media (distinct) per
-- block of the run, stopping at the first block no part holds. If n exceeds ARGV[1] the
-- caller declared too few keys: returns {n} alone, and it asks again with n.
local k, nb = tonumber(ARGV[1]), tonumber(ARGV[2])
local raw = redis.call('HGETALL', KEYS[1])
local n = #raw / 2
if n > k then
  return {n}
end
local media = {}
for i = 1, #raw, 2 do
  media[tonumber(raw[i])] = string.match(raw[i + 1], '^[^|]*|(.*)$')
end
local out = {}
for i = 3, #ARGV, 2 do
  local m, j = ARGV[i], tonumber(ARGV[i + 1])
  local held, seen = {}, {}
  for p = 0, n - 1 do
    if redis.call('SISMEMBER', KEYS[1 + p * nb + j], m) == 1 then
      local medium = media[p]
      if not seen[medium] then
        seen[medium] = true
        held[#held + 1] = medium
      end
    end
  end
  if #held == 0 then
    break
  end
  out[#out + 1] = held
end
return {n, out}
