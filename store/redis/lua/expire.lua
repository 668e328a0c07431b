-- Drop one worker's (or the retired record's) idle residencies holding no block: least
-- recently stored first, at most ARGV[2] looked at. Those holding blocks are left to the
-- worker's writer (store.redis: dropping them needs its mirror's reverse map).
-- KEYS[1]    the worker's seen sorted set (session id -> -last store there)
-- KEYS[2]    the worker's residency hash (session id -> "<last store>[;<lost>;<block size>;
--            ...] <part>:<count> ...", holding a space exactly when it lists blocks); absent
--            for the retired record
-- KEYS[3]    the worker's meta hash: a dropped residency's lost blocks leave its loss sums
--            (layout.LOSS_FIELDS), if it has them; absent for the retired record
-- ARGV[1]    -older_than: a residency is idle when its score is above it
-- ARGV[2]    the most residencies looked at
-- Returns {more, dropped ids...}: more is "1" when every residency looked at was dropped
-- and more are idle (the caller's next pass should not wait), else "0".
local limit = tonumber(ARGV[2])
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', '(' .. ARGV[1], 'LIMIT', 0, limit + 1)
local out = {'0'}
local looked = math.min(#ids, limit)
local hurt, lost, tokens = 0, 0, 0
for i = 1, looked do
  local sid = ids[i]
  local res = KEYS[2] and redis.call('HGET', KEYS[2], sid)
  if not res or not string.find(res, ' ', 1, true) then
    redis.call('ZREM', KEYS[1], sid)
    if KEYS[2] then
      redis.call('HDEL', KEYS[2], sid)
    end
    out[#out + 1] = sid
    if res then
      local n, size = string.match(res, '^[^ ;]*;(%d+);(%d*);')
      n = tonumber(n)
      if n and n > 0 then
        hurt = hurt + 1
        lost = lost + n
        tokens = tokens + n * (tonumber(size) or 0)
      end
    end
  end
end
if lost > 0 and redis.call('HEXISTS', KEYS[3], 'l_hurt') == 1 then
  -- 0 - x, not -x: Lua's -0 is "-0", which HINCRBY refuses
  redis.call('HINCRBY', KEYS[3], 'l_hurt', 0 - hurt)
  redis.call('HINCRBY', KEYS[3], 'l_blocks', 0 - lost)
  redis.call('HINCRBY', KEYS[3], 'l_tokens', 0 - tokens)
end
if #ids > limit and #out == looked + 1 then
  out[1] = '1'
end
return out
