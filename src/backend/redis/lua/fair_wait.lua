-- Keeps a waiter's place in a fair lock's queue alive, or takes it out of the queue.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the waiter queue
-- KEYS[3]  the waiter timeouts
-- ARGV[1]  holder id
-- ARGV[2]  waiter timeout in milliseconds, or '0' to leave the queue
-- ARGV[3]  release channel (to pass the wake-up on when the head leaves a free lock)
--
-- Returns 0 when the holder is not queued (it was purged, or has left), 1 when it is queued,
-- 2 when it is queued at the head and the lock is free: its turn.
local lock, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local holder = ARGV[1]
local timeout = tonumber(ARGV[2])
local now = now_ms()
local head_before = redis.call('LINDEX', queue, 0)
purge_waiters(queue, timeouts, now)
if timeout == 0 then
  redis.call('LREM', queue, 0, holder)
  redis.call('ZREM', timeouts, holder)
end
local head = redis.call('LINDEX', queue, 0)
if head and head ~= head_before and redis.call('EXISTS', lock) == 0 then
  publish(ARGV[3], head)
end
if timeout == 0 or not redis.call('ZSCORE', timeouts, holder) then
  return 0
end
redis.call('ZADD', timeouts, now + timeout, holder)
extend(queue, timeout)
extend(timeouts, timeout)
if head == holder and redis.call('EXISTS', lock) == 0 then
  return 2
end
return 1
