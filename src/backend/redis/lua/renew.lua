-- Extends a holder's lease, owner-checked; never shortens it (a re-entry may have set a longer
-- one).
--
-- KEYS[1]  the lock: a single hold or a hash (see acquire.lua)
-- ARGV[1]  the holder's owner prefix: its id's length, ':', the id (see acquire.lua)
-- ARGV[2]  lease in milliseconds
--
-- Returns 1 when renewed, 0 when the holder no longer holds the lock.
local single = redis.pcall('GET', KEYS[1])
local held
if type(single) == 'string' then
  held = single_hold_by(single, ARGV[1])
else
  held = single and redis.call('HEXISTS', KEYS[1], holder_in(ARGV[1])) == 1
end
if held then
  extend_lease(KEYS[1], ARGV[2])
  return 1
end
return 0
