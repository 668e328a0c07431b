-- The run of a prompt's blocks, from the first, that each of some workers holds, and in
-- which media. All workers of a standalone server go in one call; on a cluster, one call per
-- worker (its keys share its slot, another worker's do not).
-- KEYS            each worker's parts hash (pid -> "<group>|<medium>")
-- ARGV            per block, in prompt order: its set member, its entry-index bucket (0-127)
-- Returns {i, matched, ...} for each worker i (its place in KEYS) that holds the prompt's
-- first block: matched is one list of media (distinct) per block of the run, stopping at
-- the first block no part holds. A worker holding none is left out: most of a fleet, so
-- such a worker costs its parts hash and one SISMEMBER per part, nothing more.
-- The entry-index buckets are not declared: bucket b of part p is the parts hash's name with
-- `e:<p>:<b>` for `parts` (store/redis/layout.py), a key of the same worker, so of the same
-- hash slot. Declaring them took a key per prompt bucket per part per worker: 1,300
-- arguments for a 12-block prompt over 100 workers, most of the call's cost.
local first, first_bucket = ARGV[1], ARGV[2]

local function walk(heads, parts)
  local matched = {}
  for a = 1, #ARGV, 2 do
    local m, b = ARGV[a], ARGV[a + 1]
    local held, seen = {}, {}
    for k, head in ipairs(heads) do
      local medium = string.match(parts[2 * k], '^[^|]*|(.*)$')
      if not seen[medium] and redis.call('SISMEMBER', head .. b, m) == 1 then
        seen[medium] = true
        held[#held + 1] = medium
      end
    end
    if #held == 0 then
      break
    end
    matched[#matched + 1] = held
  end
  return matched
end

local result = {}
for i = 1, #KEYS do
  local parts = redis.call('HGETALL', KEYS[i])
  local base = string.sub(KEYS[i], 1, -6) .. 'e:'
  local heads, holds = {}, false
  for k = 1, #parts, 2 do
    local head = base .. parts[k] .. ':'
    heads[#heads + 1] = head
    holds = holds or redis.call('SISMEMBER', head .. first_bucket, first) == 1
  end
  if holds then
    result[#result + 1] = i
    result[#result + 1] = walk(heads, parts)
  end
end
return result
