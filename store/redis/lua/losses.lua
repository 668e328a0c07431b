-- What eviction took from one worker's sessions (store.model.tally_losses), summed here so
-- the metrics refresher neither fetches nor decodes every residency value: 100,000 of them
-- decoded in the API process stalled its requests by tens of ms every refresh.
-- KEYS[1]  the worker's meta hash (a worker removed meanwhile has none)
-- KEYS[2]  the worker's residency hash: values `<last_seen>[;<lost>;<block size>;...] ...`
--          (store/redis/layout.py); a value without the `;` part lost nothing
-- Returns {exists (0 or 1), sessions hurt, lost blocks, re-prefill tokens}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0, 0, 0}
end
local hurt, lost, tokens = 0, 0, 0
for _, value in ipairs(redis.call('HVALS', KEYS[2])) do
  local n, size = string.match(value, '^[^ ;]*;(%d+);(%d*);')
  n = tonumber(n)
  if n and n > 0 then
    hurt = hurt + 1
    lost = lost + n
    if size ~= '' then
      tokens = tokens + n * tonumber(size)
    end
  end
end
return {1, hurt, lost, tokens}
