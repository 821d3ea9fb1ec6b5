-- Extends a hold's lease, owner-checked; never shortens it (a re-entry may have set a longer
-- one).
--
-- KEYS[1]  the lock: a single hold or a hash (see acquire.lua)
-- ARGV[1]  the holder's owner prefix (its id's length, ':', the id; see acquire.lua), followed
--          by the attempt that granted the hold, or by nothing for any hold of the holder
-- ARGV[2]  lease in milliseconds (for a lock on a client lease: how long its key lives)
--
-- Returns 1 when renewed, 0 when the hold is over: the holder no longer holds the lock, or
-- holds it by another grant (a lock whose client lease ran out is nobody's, and is deleted).
local single = redis.pcall('GET', KEYS[1])
if not single then
  return 0
end
local held, lease = holds_named(KEYS[1], type(single) == 'string' and single, ARGV[1])
if type(held) == 'table' then
  return held
end
if held and not lapsed(KEYS[1], lease) then
  extend_lease(KEYS[1], ARGV[2])
  return 1
end
return 0
