-- Extends a holder's lease, owner-checked; never shortens it (a re-entry may have set a longer
-- one).
--
-- KEYS[1]  the lock hash
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
--
-- Returns 1 when renewed, 0 when the holder no longer holds the lock.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  extend(KEYS[1], ARGV[2])
  return 1
end
return 0
