-- The run of a prompt's blocks, from the first, that each of some workers holds, and in
-- which media. All workers of a standalone server go in one call; on a cluster, one call per
-- worker (its keys share its slot, another worker's do not).
-- ARGV[1]         w, the workers in this call
-- ARGV[2]         nb, the number of distinct entry-index buckets of the prompt
-- ARGV[2 + i]     for worker i (1..w), how many parts the caller declared buckets for
-- ARGV[3 + w..]   per block, in prompt order: its set member, its bucket's index j (1-based)
-- KEYS            worker after worker: its parts hash (pid -> "<group>|<medium>", pids
--                 0..n-1), then its entry-index buckets: the one for pid p and bucket j is
--                 at 1 + p * nb + j after the parts hash
-- Returns one item per worker: {n, matched}, n its part count, matched one list of media
-- (distinct) per block of the run, stopping at the first block no part holds; or {n} alone
-- if n exceeds the parts declared for it (the caller asks again with n).
local w, nb = tonumber(ARGV[1]), tonumber(ARGV[2])
local first = 3 + w

local function walk(at, k)
  local raw = redis.call('HGETALL', KEYS[at])
  local n = #raw / 2
  if n > k then
    return {n}
  end
  local media = {}
  for i = 1, #raw, 2 do
    media[tonumber(raw[i])] = string.match(raw[i + 1], '^[^|]*|(.*)$')
  end
  local out = {}
  for i = first, #ARGV, 2 do
    local m, j = ARGV[i], tonumber(ARGV[i + 1])
    local held, seen = {}, {}
    for p = 0, n - 1 do
      if redis.call('SISMEMBER', KEYS[at + p * nb + j], m) == 1 then
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
end

local result, at = {}, 1
for i = 1, w do
  local k = tonumber(ARGV[2 + i])
  result[i] = walk(at, k)
  at = at + 1 + k * nb
end
return result
