-- Extends many holders' leases in one call, each as renew.lua does: owner-checked, never
-- shortened. A key holding foreign data answers for itself and stops no other renewal.
--
-- KEYS[i]        a lock: a single hold or a hash (see acquire.lua)
-- ARGV[2i - 1]   its holder's owner prefix: the id's length, ':', the id (see acquire.lua)
-- ARGV[2i]       its lease in milliseconds (for a lock on a client lease: how long its key
--                lives; a lock whose client lease ran out is nobody's, and is deleted)
--
-- Returns one reply per key: 1 when renewed, 0 when the holder no longer holds the lock, -1
-- when the key holds another type of value.
local replies = {}
-- One read for every single hold: MGET answers false for a key that is missing or not a
-- string, which then answers for itself. A user whose ACL predates MGET here (it is refused)
-- reads them one GET at a time instead.
local singles = redis.pcall('MGET', unpack(KEYS))
local one_by_one = singles.err ~= nil
for i, lock in ipairs(KEYS) do
  local owner = ARGV[2 * i - 1]
  local single
  if one_by_one then
    single = redis.pcall('GET', lock)
    single = type(single) == 'string' and single
  else
    single = singles[i]
  end
  local held, lease
  if single then
    held = single_hold_by(single, owner) and 1 or 0
    lease = single_lease(single)
  else
    -- A missing key answers {false, false}; foreign data, an error.
    local found = redis.pcall('HMGET', lock, holder_in(owner), '~s')
    if found.err then
      held = found
    else
      held = found[1] and 1 or 0
      lease = found[2]
    end
  end
  if type(held) == 'table' then
    replies[i] = -1
  elseif held == 1 and lapsed(lock, lease) then
    replies[i] = 0
  elseif held == 1 then
    extend_lease(lock, ARGV[2 * i])
    replies[i] = 1
  else
    replies[i] = 0
  end
end
return replies
