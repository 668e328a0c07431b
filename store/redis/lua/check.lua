-- The checks before a guarded write to one worker: the fence rule and the version check.
-- apply.lua and guard.lua start with this text (store.redis.reads.write_script joins them).
-- KEYS[1]    the worker's meta hash (fields seq, epoch, last_ts: the fence; ver: the version)
-- KEYS[2]    the worker's version log, newest first: "<previous ver> <new ver> <batch id>"
-- ARGV[1]    "batch" (store.model.decide's fence rule applies) or "op" (version check only)
-- ARGV[2]    the batch's seq ("" for op); compared as a Lua number, exact below 2^53
-- ARGV[3]    the batch's ts ("" for op)
-- ARGV[4]    version the writer's mirror reflects ("" = never written, "-" = no mirror)
-- ARGV[5]    outcome the writer predicted from its mirror ("applied" for op)
-- ARGV[6]    "<seq> <epoch>" of a fence the writer saw stored, or "": a stored fence that
--            is missing or older (store.model.fell_behind) means the store lost data, and
--            the reply is "lost" with the stored seq
-- check() returns nil, outcome, version when the write may go ahead, else the reply
-- {outcome, current version, next version, next batch id}: outcome is one of
-- store.model.ApplyOutcome's values, "lost" (then the third item is the stored seq, or
-- ""), or "stale" (the mirror is not the stored version). For duplicate and
-- previous_engine, the next version/batch are the log entry that followed ARGV[4], so a
-- writer that saw the same batch can follow without reloading.
local function check()
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
  return nil, outcome, ver
end
