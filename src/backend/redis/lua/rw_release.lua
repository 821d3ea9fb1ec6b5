-- Releases one hold (or all holds) of one side of a read-write lock, owner-checked. With an
-- attempt id and a time to remember it, undoes that attempt if it was the holder's last (a lost
-- acquire), and otherwise records it as given up so that it is refused should it still arrive;
-- with an attempt id and 0, releases only while the hold is still the one that attempt granted.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the readers
-- KEYS[3]  attempts given up on (set)
-- ARGV[1]  holder id
-- ARGV[2]  'r' or 'w'
-- ARGV[3]  release channel
-- ARGV[4]  '1' to release every hold of that side, '0' for one
-- ARGV[5]  attempt id that must be recorded: the hold's grant ('a:<side>:<holder>'), or for
--          one hold its last re-entry ('e:<side>:<holder>') too; '' for any
-- ARGV[6]  with an attempt id: how long to remember it as given up, in milliseconds; 0 for a
--          release that names the hold's grant (see give_back_attempt)
-- ARGV[7]  the attempt that took the hold given back (its grant's or a re-entry's), whose
--          lease goes with it; '' for the hold whose lease ends first
--
-- Readers whose lease ended are dropped first (as every read-write script does).
--
-- Returns {0} when the holder does not hold that side (or its lease ended), {1, remaining}
-- when holds remain (and one of their leases has not ended),
-- {2, n} when the change may let waiters in (n: subscribers notified), {3} when the holder's
-- holds are gone but the lock stays held by others.
local lock, readers = KEYS[1], KEYS[2]
local holder, side = ARGV[1], ARGV[2]
local field = side .. ':' .. holder
-- Holds whose lease ended are nobody's: a late release of one gives back nothing, and the
-- readers left decide whether the lock is free (a crashed reader must not keep the release
-- of the last live one from being published).
local now = now_ms()
purge_readers(lock, readers, now)
purge_writer(lock, readers, now)
local remaining, ends = give_back_attempt(lock, field, ARGV[4] == '1', ARGV[5], KEYS[3],
  ARGV[6], ARGV[7])
if not remaining then
  return {0}
end
if remaining > 0 then
  -- The holds left keep the side until the latest of their own leases ends: the lease of the
  -- hold given back no longer counts.
  if not ends or ends > now then
    if ends and side == 'r' then
      redis.call('ZADD', readers, ends, holder)
    elseif ends then
      redis.call('HSET', lock, '~w', ends)
    end
    return {1, remaining}
  end
  -- Every hold left has run out: the holder's side is over.
  redis.call('HDEL', lock, field, 'a:' .. field, 'e:' .. field, 'l:' .. field)
end
if side == 'r' then
  redis.call('ZREM', readers, holder)
else
  redis.call('HDEL', lock, '~w')
end
local writer = side == 'w'
if not writer then
  for _, f in ipairs(redis.call('HKEYS', lock)) do
    if string.sub(f, 1, 2) == 'w:' then
      writer = true
    end
  end
  if writer then
    -- A writer released its own read hold: it still holds the write side.
    return {3}
  end
end
if redis.call('ZCARD', readers) == 0 then
  redis.call('DEL', lock)
else
  redis.call('HSET', lock, '~m', 'read')
  if side == 'r' then
    return {3}
  end
end
return {2, publish(ARGV[3], 'released')}
