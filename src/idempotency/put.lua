-- Keeps the answer to an idempotency key, fenced by the token of the key's lock.
--
-- KEYS[1]: the answer's key: the lock's name + ":answer" (the lock's Cluster hash slot), a hash
--          with the fields `token` and `answer`
-- ARGV[1]: the fencing token of the lock held while the answer was made (decimal)
-- ARGV[2]: the encoded answer
-- ARGV[3]: how long to keep it, in milliseconds
--
-- Returns the token of the answer kept after the call, as a string: ARGV[1] when this answer
-- is kept (it replaced none, or one with a lower or equal token), or the higher token of a
-- later holder's answer, which is left as it is.
--
-- Tokens are below 2^53 (the lock store's clock in milliseconds times 1000), so Lua's numbers
-- compare them exactly.
local kept = redis.call('HGET', KEYS[1], 'token')
if kept and tonumber(kept) > tonumber(ARGV[1]) then
  return kept
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'answer', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return ARGV[1]
