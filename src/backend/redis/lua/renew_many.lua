-- Extends many holds' leases in one call, each as renew.lua does: owner-checked, never
-- shortened. A key holding foreign data answers for itself and stops no other renewal.
--
-- KEYS[i]        a lock: a single hold or a hash (see acquire.lua)
-- ARGV[2i - 1]   its holder's owner prefix followed by the attempt that granted the hold, or
--                by nothing (see renew.lua)
-- ARGV[2i]       its lease in milliseconds (for a lock on a client lease: how long its key
--                lives; a lock whose client lease ran out is nobody's, and is deleted)
--
-- Returns one reply per key: 1 when renewed, 0 when the hold is over, -1 when the key holds
-- another type of value.
local replies = {}
-- One read for every single hold: MGET answers false for a key that is missing or not a
-- string, which then answers for itself. A user whose ACL predates MGET here (it is refused)
-- reads them one GET at a time instead.
local singles = redis.pcall('MGET', unpack(KEYS))
local one_by_one = singles.err ~= nil
for i, lock in ipairs(KEYS) do
  local single
  if one_by_one then
    single = redis.pcall('GET', lock)
    single = type(single) == 'string' and single
  else
    single = singles[i]
  end
  local held, lease = holds_named(lock, single, ARGV[2 * i - 1])
  if type(held) == 'table' then
    replies[i] = -1
  elseif held and not lapsed(lock, lease) then
    extend_lease(lock, ARGV[2 * i])
    replies[i] = 1
  else
    replies[i] = 0
  end
end
return replies
