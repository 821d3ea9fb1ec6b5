-- Keeps a waiter's place in the queue of a fair lock or of a read-write lock's writers alive, or
-- takes it out. Passes the wake-up on when the head of the queue changes while the lock is free
-- (a fair waiter listens for its own name), or when the queue empties (readers held back by
-- waiting writers look again).
--
-- KEYS[1]  the waiter queue (see acquire.lua)
-- KEYS[2]  the waiters' places
-- KEYS[3]  the owner record
-- KEYS[4]  write: the readers
-- ARGV[1]  the holder
-- ARGV[2]  ms to keep its place from now, or '0' to leave the queue
-- ARGV[3]  the release channel
--
-- Returns 0 when the holder is not queued (its place was dropped, or it left), 1 when it is, 2
-- when it is first and the lock is free: its turn to acquire.
local queue, places, holder, ms = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local head = redis.call('LINDEX', queue, 0)
purge_queue(queue, places, now)
if ms == 0 then
  redis.call('LREM', queue, 0, holder)
  redis.call('ZREM', places, holder)
end
local free = redis.call('EXISTS', KEYS[3]) == 0
if free and KEYS[4] then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  free = redis.call('ZCARD', KEYS[4]) == 0
end
local first = redis.call('LINDEX', queue, 0)
if first ~= head and (free or not first) then
  publish(ARGV[3], first or 'released')
end
if ms == 0 or not redis.call('ZSCORE', places, holder) then
  return 0
end
redis.call('ZADD', places, now + ms, holder)
extend(queue, ms)
extend(places, ms)
return (first == holder and free) and 2 or 1
