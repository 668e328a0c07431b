-- A worker's stream health, and its change-feed record when the state or detail changed.
-- KEYS[1]    the worker's meta hash (fields state, since, detail, lost, model)
-- KEYS[2]    the worker's feed stream
-- ARGV[1..4] state, since, detail, lost
-- ARGV[5]    the feed stream's length bound (XADD MAXLEN ~)
-- ARGV[6]    the record to add if (state, detail) changed (msgpack store.feed.FeedRecord)
-- ARGV[7]    the worker's model; "" when unknown (the field is removed)
-- ARGV[8..12] the stream's gaps, replays, restarts, lag in batches and in seconds
-- ARGV[13]   the writer's roster epoch, or "" (unfenced): a status of an older epoch than
--            the meta's `sepoch` (the last fenced one) is refused, nothing written
-- An absent state reads as "connecting" with an empty detail, as a new worker's status.
-- Returns 1 if the record was added, 2 if not but the model changed, 0 if neither, -1 if
-- the status was refused.
local old = redis.call('HMGET', KEYS[1], 'state', 'detail', 'sepoch', 'model')
if ARGV[13] ~= '' then
  local epoch = tonumber(ARGV[13])
  if old[3] and epoch < tonumber(old[3]) then
    return -1
  end
  redis.call('HSET', KEYS[1], 'sepoch', ARGV[13])
end
local state, detail = old[1] or 'connecting', old[2] or ''
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'since', ARGV[2], 'detail', ARGV[3], 'lost', ARGV[4],
  'gaps', ARGV[8], 'replays', ARGV[9], 'restarts', ARGV[10], 'lag', ARGV[11], 'lag_s', ARGV[12])
if ARGV[7] == '' then
  redis.call('HDEL', KEYS[1], 'model')
else
  redis.call('HSET', KEYS[1], 'model', ARGV[7])
end
if state == ARGV[1] and detail == ARGV[3] then
  if (old[4] or '') ~= ARGV[7] then
    return 2
  end
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'r', ARGV[6])
return 1
