-- The run of a prompt's blocks, from the first, that each of some workers holds, and in
-- which media. The workers: those the first block's directory set names (standalone
-- servers: ARGV[3] is "1" and KEYS[1] is that set), and those whose parts hash is in KEYS
-- (workers from before the directory; on a cluster, the one worker of each call).
-- KEYS            [the first block's directory set,] then parts hashes (pid -> "<group>|<medium>")
-- ARGV[1]         the key prefix (a worker's keys are `<prefix>:{<pod>/<rank>}:<name>`)
-- ARGV[2]         the prune time: a directory entry asserted before it whose worker does not
--                 hold the first block is dropped (a newer one may announce a write in flight)
-- ARGV[3]         "1" if KEYS[1] is the directory set, else "0"
-- ARGV[4..]       per block, in prompt order: its set member, its entry-index bucket (0-127)
-- Returns {worker, matched, ...} for each worker (`<pod>/<rank>`) that holds the prompt's
-- first block: matched is one list of media (distinct) per block of the run, stopping at
-- the first block no part holds. A worker holding none is left out.
-- Keys named here, not declared: a worker's parts hash from the directory's members and the
-- entry-index buckets `P:{W}:e:<p>:<b>` from a parts hash's name (store/redis/layout.py).
-- The directory's workers span slots: that mode runs on standalone servers only.
local prefix, prune, hinted = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local first, first_bucket = ARGV[4], ARGV[5]

local function walk(heads, parts)
  local matched = {}
  for a = 4, #ARGV, 2 do
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

-- The worker's match, or nil if it lacks the first block.
local function match(parts_key)
  local parts = redis.call('HGETALL', parts_key)
  local base = string.sub(parts_key, 1, -6) .. 'e:'
  local heads, holds = {}, false
  for k = 1, #parts, 2 do
    local head = base .. parts[k] .. ':'
    heads[#heads + 1] = head
    holds = holds or redis.call('SISMEMBER', head .. first_bucket, first) == 1
  end
  if holds then
    return walk(heads, parts)
  end
  return nil
end

local result = {}
local from = 1
if hinted then
  from = 2
  local named = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #named, 2 do
    local w = named[i]
    local matched = match(prefix .. ':{' .. w .. '}:parts')
    if matched then
      result[#result + 1] = w
      result[#result + 1] = matched
    elseif tonumber(named[i + 1]) < prune then
      redis.call('ZREM', KEYS[1], w)
    end
  end
end
for i = from, #KEYS do
  local matched = match(KEYS[i])
  if matched then
    result[#result + 1] = string.match(KEYS[i], '{(.*)}')
    result[#result + 1] = matched
  end
end
return result
