-- Acquires a permit of a semaphore: at most ARGV[4] holders hold one at once.
--
-- Laid out as the read side of a read-write lock (rw_acquire.lua) with a cap on the readers:
-- the hash holds 'r:<holder>' = the holder's hold count (a holder that acquires again nests in
-- the permit it has), 'a:r:<holder>' = the attempt that granted the permit, 'e:r:<holder>' = its
-- last re-entry's attempt, 'l:r:<holder>' = the lease of each of its holds (see hold_ends in
-- the prelude), and '~p' = the permit count the last grant was made under (for
-- inspection). Each holder's own lease is its score in the holders set, so one dead holder's
-- permit comes back without cutting the others short; the hash lives as long as the longest
-- lease. rw_renew.lua (side 'r') renews a permit.
--
-- KEYS[1]  the semaphore hash
-- KEYS[2]  the holders (sorted set: holder id -> server time in ms its lease ends)
-- KEYS[3]  attempts given up on (set), so one that arrives late is refused
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  attempt id
-- ARGV[4]  how many holders may hold a permit at once
-- ARGV[5]  an earlier attempt of this acquisition whose reply was lost, or ''
-- ARGV[6]  re-entry, as in acquire.lua
-- ARGV[7]  the server's boot check, or '' (as in acquire.lua, which also says what {-2} means)
-- ARGV[8]  the latest server time at which this request may act, or '' (as ARGV[9] of
--          acquire.lua: a later one does nothing and answers {-4})
--
-- Returns {1, count, -1} when granted, or {0, retry} when every permit is taken (retry: ms
-- until the first holder's lease ends).
local sem, holders = KEYS[1], KEYS[2]
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
if arrived_late(ARGV[8]) then
  return {-4}
end
local left = boot_unverified(ARGV[7])
if left then
  return {-2, left}
end
if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 1 then
  return {0, redis.call('PTTL', sem)}
end
local now = now_ms()
purge_readers(sem, holders, now)
local field = 'r:' .. holder
local grant, reentry = 'a:' .. field, 'e:' .. field
local holds = redis.call('HEXISTS', sem, field) == 1
if (ARGV[6] == 'held' and not holds)
    or (holds and not may_reenter(sem, ARGV[6], ARGV[5], grant, reentry)) then
  return {0, redis.call('PTTL', sem)}
end
if not holds and redis.call('ZCARD', holders) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - now}
end
local taken_over = recorded(sem, ARGV[5], grant, reentry) and ARGV[5] or nil
local count = reenter(sem, field, ARGV[3], ARGV[5], grant, reentry)
-- Each hold keeps its own lease (see hold_ends in the prelude).
add_hold_end(sem, field, ARGV[3], taken_over, now + lease)
if count == 1 then
  redis.call('HSET', sem, grant, ARGV[3])
  redis.call('HDEL', sem, reentry)
end
redis.call('HSET', sem, '~p', ARGV[4])
-- A re-entry with a shorter lease never cuts the holder's earlier lease short.
redis.call('ZADD', holders, 'GT', now + lease, holder)
-- The holders live as long as the hash (see rw_acquire.lua): a permit whose entry went with
-- an expired set while the hash lived on would be counted in the hash, and re-entered, with
-- its lease over and its permit given to another.
extend(sem, lease)
extend(holders, redis.call('PTTL', sem))
return {1, count, -1}
