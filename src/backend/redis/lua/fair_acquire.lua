-- Acquires a fair (FIFO) lock: the lock goes to the head of the waiter queue, never to a
-- newcomer while live waiters are queued. Time comes from the server, never from clients.
--
-- KEYS[1]  the lock hash (same layout as acquire.lua, and '~k' = 'fair')
-- KEYS[2]  the waiter queue (list of holder ids, oldest first)
-- KEYS[3]  the waiter timeouts (sorted set: holder id -> server time in ms it may live until)
-- KEYS[4]  the fencing record (the last token issued; lives 5 s after a grant)
-- KEYS[5]  attempts given up on (set), so one that arrives late is refused
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  attempt id
-- ARGV[4]  '1' to issue a fencing token
-- ARGV[5]  waiter timeout in milliseconds; '0' to try without joining the queue
-- ARGV[6]  an earlier attempt of this acquisition whose reply was lost, or ''
-- ARGV[7]  re-entry, as in acquire.lua ('held': nothing is queued either)
-- ARGV[8]  the server's boot check, or '' (as in acquire.lua, which also says what {-2} means)
-- ARGV[9]  the latest server time at which this request may act, or '' (as ARGV[9] of
--          acquire.lua: a later one does nothing and answers {-4})
--
-- Returns {1, count, token} when the holder now holds the lock (token -1 without fencing), or
-- {0, retry} when it must wait: retry is the lock's remaining lease, or while the lock is free
-- but another waiter is first, the time that waiter may still take to claim it (-1: unknown).
local lock, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local holder = ARGV[1]
if arrived_late(ARGV[9]) then
  return {-4}
end
local left = boot_unverified(ARGV[8])
if left then
  return {-2, left}
end
if redis.call('SISMEMBER', KEYS[5], ARGV[3]) == 1 then
  return {0, redis.call('PTTL', lock)}
end
local holds = redis.call('HEXISTS', lock, holder) == 1
if ARGV[7] == 'held' and not holds then
  return {0, redis.call('PTTL', lock)}
end
local now = now_ms()

-- Waiters that stopped keeping their place alive are dropped.
purge_waiters(queue, timeouts, now)

local count
if holds and may_reenter(lock, ARGV[7], ARGV[6], '~a', '~r') then
  count = reenter(lock, holder, ARGV[3], ARGV[6], '~a', '~r')
else
  local head = redis.call('LINDEX', queue, 0)
  if redis.call('EXISTS', lock) == 1 or (head and head ~= holder) then
    local timeout = tonumber(ARGV[5])
    if timeout > 0 then
      if not redis.call('ZSCORE', timeouts, holder) then
        redis.call('RPUSH', queue, holder)
      end
      redis.call('ZADD', timeouts, now + timeout, holder)
      extend(queue, timeout)
      extend(timeouts, timeout)
    end
    local retry = redis.call('PTTL', lock)
    if retry < 0 and head and head ~= holder then
      retry = tonumber(redis.call('ZSCORE', timeouts, head)) - now
    end
    return {0, retry}
  end
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', timeouts, holder)
  end
  count = 1
  -- '~k' marks the hold as a fair one, for inspect.lua: the data is otherwise the same.
  redis.call('HSET', lock, holder, 1, '~a', ARGV[3], '~k', 'fair')
end
return granted(lock, ARGV[2], count, ARGV[4], KEYS[4])
