-- A guarded write to one worker: the fence rule and the version check, then plain writes.
-- KEYS[1]    the worker's meta hash (fields seq, epoch, last_ts: the fence; ver: the version)
-- KEYS[2]    the worker's version log, newest first: "<previous ver> <new ver> <batch id>"
-- KEYS[3..]  further keys of the same worker, taken in order by the ops; on a standalone
--            server also the directories' sets a write asserts (store/README.md "Redis:
--            directories"), which only a server without slots lets one script write
-- ARGV[1]    "batch" (store.model.decide's fence rule applies) or "op" (version check only)
-- ARGV[2]    the batch's seq ("" for op); compared as a Lua number, exact below 2^53
-- ARGV[3]    the batch's ts ("" for op)
-- ARGV[4]    version the writer's mirror reflects ("" = never written, "-" = no mirror)
-- ARGV[5]    outcome the writer predicted from its mirror ("applied" for op)
-- ARGV[6]    "<seq> <epoch>" of a fence the writer saw stored, or "": a stored fence that
--            is missing or older (store.model.fell_behind) means the store lost data, and
--            the call returns "lost" with the stored seq, writing nothing
-- ARGV[7..]  ops, each: code, count, args... (store/redis/plan.py): an op takes the next
--            key and `count` args, or for DEL/SUNIONSTORE the next `count` keys, or for S
--            (below) the next `count` keys and `count` args, one each. An XADD op (the
--            change feed's record) runs only here, after the checks: a duplicate or stale
--            call adds nothing, so each applied batch is in the feed once.
--            Entry index: B takes the next key as the base of the bucket names that follow
--            (a part's `P:{W}:e:<pid>:`); F SADDs its `count` args to the next key and marks
--            each in the index, E SREMs them from the next key and marks each out of it, S
--            SREMs one member per key (the next `count` keys) and marks each out, I marks
--            args in the index (no key). Marks
--            are kept per member, the last one winning, and written once per bucket at the
--            end of the call, or before a DEL (which may delete buckets). The bucket keys are
--            named here, not declared: keys of the same worker, so of the declared keys' slot
-- Returns {outcome, current version, next version, next batch id}: outcome is one of
-- store.model.ApplyOutcome's values, "lost" (then the third item is the stored seq, or
-- ""), or "stale" (the mirror is not the stored version: nothing
-- was written). For duplicate and previous_engine, the next version/batch are the log entry
-- that followed ARGV[4], so a writer that saw the same batch can follow without reloading.
local CMD = {
  a = 'SADD', r = 'SREM', d = 'DEL', h = 'HSET', n = 'HSETNX', H = 'HDEL',
  z = 'ZADD', Z = 'ZREM', u = 'SUNIONSTORE', l = 'LPUSH', t = 'LTRIM', x = 'XADD',
  e = 'EXPIRE',
}
local CHUNK = 4000

-- A member's entry-index bucket, as store.redis.layout.bucket computes it from the hash:
-- a digest's last byte, else the u64's low 7 bits. The member is the u64 as a signed
-- decimal; 10^7 is a multiple of 128, so its last 7 digits carry its low 7 bits, and a
-- negative one (the u64 minus 2^64, also a multiple of 128) counts down from 128.
-- Marks are kept per base and bucket number, the key named once per bucket at the flush:
-- this loop runs once per stored or evicted member.
local byte, sub, max = string.byte, string.sub, math.max
local base, marks, bases = nil, nil, {}
local function mark(from, to, present)
  for j = from, to do
    local m = ARGV[j]
    local first = byte(m, 1)
    local b
    if first == 0 then
      b = byte(m, -1) % 128
    elseif first == 45 then
      b = (128 - tonumber(sub(m, max(2, #m - 6))) % 128) % 128
    else
      b = tonumber(sub(m, -7)) % 128
    end
    local t = marks[b]
    if not t then
      t = {}
      marks[b] = t
    end
    t[m] = present
  end
end

local function write(cmd, key, list)
  for s = 1, #list, CHUNK do
    redis.call(cmd, key, unpack(list, s, math.min(s + CHUNK - 1, #list)))
  end
end

local function flush()
  for head, buckets in pairs(bases) do
    for b, t in pairs(buckets) do
      local add, rem = {}, {}
      for m, present in pairs(t) do
        if present then
          add[#add + 1] = m
        else
          rem[#rem + 1] = m
        end
      end
      local key = head .. b
      write('SREM', key, rem)
      write('SADD', key, add)
    end
  end
  bases = {}
  if base then
    marks = {}
    bases[base] = marks
  end
end

local m = redis.call('HMGET', KEYS[1], 'seq', 'epoch', 'last_ts', 'ver')
local ver = m[4] or ''
if ARGV[6] ~= '' then
  local eseq, eepoch = string.match(ARGV[6], '^(%S+) (%S+)$')
  eseq, eepoch = tonumber(eseq), tonumber(eepoch)
  if not m[1] then
    return {'lost', ver, '', ''}
  end
  local sepoch = tonumber(m[2])
  if sepoch < eepoch or (sepoch == eepoch and tonumber(m[1]) < eseq) then
    return {'lost', ver, m[1], ''}
  end
end
local outcome = 'applied'
if ARGV[1] == 'batch' and m[1] then
  local seq, ts = tonumber(ARGV[2]), tonumber(ARGV[3])
  if ts < tonumber(m[2]) then
    outcome = 'previous_engine'
  elseif seq > tonumber(m[1]) then
    outcome = 'applied'
  elseif ts > tonumber(m[3]) then
    outcome = 'restarted'
  else
    outcome = 'duplicate'
  end
end

if outcome == 'duplicate' or outcome == 'previous_engine' then
  if ver ~= ARGV[4] and ARGV[4] ~= '-' then
    for _, entry in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
      local prev, nxt, id = string.match(entry, '^(%S*) (%S+) (.*)$')
      if prev == ARGV[4] then
        return {outcome, ver, nxt, id}
      end
    end
  end
  return {outcome, ver, '', ''}
end
if ver ~= ARGV[4] or outcome ~= ARGV[5] then
  return {'stale', ver, '', ''}
end

local i, k, n = 7, 3, #ARGV
while i <= n do
  local code, count = ARGV[i], tonumber(ARGV[i + 1])
  if code == 'F' or code == 'E' or code == 'I' then
    if code == 'F' then
      redis.call('SADD', KEYS[k], unpack(ARGV, i + 2, i + 1 + count))
      k = k + 1
    elseif code == 'E' then
      redis.call('SREM', KEYS[k], unpack(ARGV, i + 2, i + 1 + count))
      k = k + 1
    end
    mark(i + 2, i + 1 + count, code ~= 'E')
    i = i + 2 + count
  elseif code == 'S' then
    for j = 0, count - 1 do
      redis.call('SREM', KEYS[k + j], ARGV[i + 2 + j])
    end
    mark(i + 2, i + 1 + count, false)
    k = k + count
    i = i + 2 + count
  elseif code == 'B' then
    base = KEYS[k]
    marks = bases[base]
    if not marks then
      marks = {}
      bases[base] = marks
    end
    k = k + 1
    i = i + 2
  elseif code == 'd' or code == 'u' then
    if code == 'd' then
      flush()
    end
    redis.call(CMD[code], unpack(KEYS, k, k + count - 1))
    k = k + count
    i = i + 2
  else
    redis.call(CMD[code], KEYS[k], unpack(ARGV, i + 2, i + 1 + count))
    k = k + 1
    i = i + 2 + count
  end
end
flush()
return {outcome, ver, '', ''}
