-- Gives back one hold (or all holds) of a holder's semaphore permit, owner-checked, and
-- announces a freed permit on the semaphore's channel (any waiter may take it). With an
-- attempt id and a time to remember it, undoes that attempt if it is the holder's last record
-- (a lost acquire), and otherwise records it as given up so that it is refused should it still
-- arrive; with an attempt id and 0, gives back only while the permit is still the one that
-- attempt granted. Layout as in sem_acquire.lua.
--
-- KEYS[1]  the semaphore hash
-- KEYS[2]  the holders
-- KEYS[3]  attempts given up on (set)
-- ARGV[1]  holder id
-- ARGV[2]  release channel
-- ARGV[3]  '1' to give back every hold, '0' for one
-- ARGV[4]  attempt id that must be recorded: the permit's grant ('a:r:<holder>'), or for one
--          hold its last re-entry ('e:r:<holder>') too; '' for any
-- ARGV[5]  with an attempt id: how long to remember it as given up, in milliseconds; 0 for a
--          release that names the permit's grant (see give_back_attempt)
-- ARGV[6]  the attempt that took the hold given back, whose lease goes with it (see
--          rw_release.lua); '' for the hold whose lease ends first
--
-- Returns {0} when the holder holds no permit, {1, remaining} when holds remain (and one of
-- their leases has not ended), {2, n} when the permit was given back (n: subscribers notified).
local sem, holders = KEYS[1], KEYS[2]
local holder = ARGV[1]
-- A permit whose lease ran out is no longer its holder's to give back.
local now = now_ms()
purge_readers(sem, holders, now)
local field = 'r:' .. holder
local remaining, ends = give_back_attempt(sem, field, ARGV[3] == '1', ARGV[4], KEYS[3],
  ARGV[5], ARGV[6])
if not remaining then
  return {0}
end
if remaining > 0 then
  -- The permit lasts until the latest lease of the holds left ends (see rw_release.lua).
  if not ends or ends > now then
    if ends then
      redis.call('ZADD', holders, ends, holder)
    end
    return {1, remaining}
  end
  redis.call('HDEL', sem, field, 'a:' .. field, 'e:' .. field, 'l:' .. field)
end
redis.call('ZREM', holders, holder)
if redis.call('ZCARD', holders) == 0 then
  redis.call('DEL', sem, holders)
end
return {2, publish(ARGV[2], 'released')}
