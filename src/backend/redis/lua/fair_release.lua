-- Releases one hold (or all holds) of a fair lock, owner-checked; when the lock becomes free,
-- wakes only the head of the waiter queue by publishing its holder id.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the waiter queue
-- KEYS[3]  the waiter timeouts
-- ARGV[1]  holder id
-- ARGV[2]  release channel
-- ARGV[3]  '1' to release every hold of the holder, '0' for one
-- ARGV[4]  attempt id that must be the lock's last recorded one, or '' for any (as in
--          release.lua)
--
-- Returns {0} when the holder does not hold the lock, {1, remaining} when holds remain,
-- {2, n} when the lock was freed (n: subscribers the wake-up reached).
local lock, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local holder = ARGV[1]
if not last_attempt_is(lock, ARGV[4]) then
  return {0}
end
local remaining = give_back(lock, holder, ARGV[3] == '1')
if not remaining then
  return {0}
end
if remaining > 0 then
  return {1, remaining}
end
redis.call('DEL', lock)
purge_waiters(queue, timeouts, now_ms())
local head = redis.call('LINDEX', queue, 0)
return {2, publish(ARGV[2], head or 'released')}
