-- Extends one side of a holder's read-write lock (or a semaphore's permit, laid out as a
-- reader), owner-checked.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the readers
-- ARGV[1]  holder id
-- ARGV[2]  'r' or 'w'
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  the attempt that granted the holder's holds of that side ('a:<side>:<holder>', or
--          their last re-entry 'e:<side>:<holder>', as in prelude.lua's holds_named), or '' for
--          any: a renewal that arrives after the holder released them and took the side anew
--          extends nothing of the new holds, which keep their own leases
--
-- Returns 1 when renewed, 0 when the holder no longer holds that side (or holds it by another
-- grant).
local lock, readers = KEYS[1], KEYS[2]
local holder, side = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[3])
local now = now_ms()
purge_writer(lock, readers, now)
-- A reader (or a semaphore's permit) whose lease ended is not brought back by a late renewal.
purge_readers(lock, readers, now)
local field = side .. ':' .. holder
local found = redis.call('HMGET', lock, field, 'a:' .. field, 'e:' .. field)
if not found[1] or (ARGV[4] ~= '' and found[2] ~= ARGV[4] and found[3] ~= ARGV[4]) then
  return 0
end
-- Every hold of that side lives on: a renewal keeps all the holder's holds.
renew_hold_ends(lock, side .. ':' .. holder, now + lease)
if side == 'r' then
  redis.call('ZADD', readers, 'GT', now + lease, holder)
else
  extend_writer(lock, now + lease)
end
-- The readers live as long as the lock (see rw_acquire.lua).
extend(lock, lease)
extend(readers, redis.call('PTTL', lock))
return 1
