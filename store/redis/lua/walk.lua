-- Walk a prompt along one worker's Dynamo edges (store/tokens.py): from the prompt's start,
-- each block under the one before by its tokens hash, as far as an edge goes.
-- KEYS[1]  the worker's edge hash (`P:{W}:tk`): `<parent member, or nothing>:<tokens hash>`
--          -> the block's member (store/redis/layout.py `edge_field`)
-- ARGV     the prompt's tokens hashes, first block first (u64 decimals)
-- Returns the members found, in order (empty: no edge of the first block).
local out, parent = {}, ''
for i = 1, #ARGV do
  local h = redis.call('HGET', KEYS[1], parent .. ':' .. ARGV[i])
  if not h then
    break
  end
  out[i] = h
  parent = h
end
return out
