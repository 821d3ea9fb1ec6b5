-- Extends a holder's lease, owner-checked; never shortens it (a re-entry may have set a longer
-- one).
--
-- KEYS[1]  the lock: a single hold or a hash (see acquire.lua)
-- ARGV[1]  the holder's owner prefix: its id's length, ':', the id (see acquire.lua)
-- ARGV[2]  lease in milliseconds (for a lock on a client lease: how long its key lives)
--
-- Returns 1 when renewed, 0 when the holder no longer holds the lock (a lock whose client
-- lease ran out is nobody's, and is deleted).
local single = redis.pcall('GET', KEYS[1])
local held, lease
if type(single) == 'string' then
  held = single_hold_by(single, ARGV[1])
  lease = single_lease(single)
elseif single then
  local found = redis.call('HMGET', KEYS[1], holder_in(ARGV[1]), '~s')
  held, lease = found[1], found[2]
end
if held and not lapsed(KEYS[1], lease) then
  extend_lease(KEYS[1], ARGV[2])
  return 1
end
return 0
