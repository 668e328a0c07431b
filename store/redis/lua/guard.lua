-- The guard of a transaction that writes to one worker (store/redis/transport.py):
--   WATCH <version log> <abort key>, EVAL guard.lua, MULTI, EXISTS <the same two>,
--   <the write's plain commands>, EXEC.
-- check.lua's checks, KEYS[1..2] and ARGV[1..6] as there; KEYS[3] the abort key, this
-- call's own (the worker's hash tag), watched since before this script ran.
-- A write that may go ahead touches nothing: its EXEC runs, unless another write of the
-- worker's version (which pushes to its log) came meanwhile. Anything else, a refusal or an error
-- (a check that fails to run), sets the abort key for a millisecond, so the EXEC that
-- follows runs nothing. Returns check.lua's reply, with a fifth item 1 when the write may
-- go ahead; an error as an error reply.
local ok, refused, outcome, ver = pcall(check)
if ok and not refused then
  return {outcome, ver, '', '', 1}
end
redis.call('SET', KEYS[3], '1', 'PX', 1)
if not ok then
  if type(refused) == 'table' then
    return refused
  end
  return redis.error_reply(tostring(refused))
end
return refused
