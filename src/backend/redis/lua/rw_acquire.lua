-- Acquires the read or the write side of a read-write lock.
--
-- The hash holds '~m' = 'read' or 'write', 'r:<holder>' and 'w:<holder>' = hold counts,
-- 'a:<side>:<holder>' = the attempt that granted that hold, 'e:<side>:<holder>' = its last
-- re-entry's attempt, 'l:<side>:<holder>' = the lease of each of that side's holds (see
-- hold_ends), '~f' = the writer's fencing token, '~w' = when the writer's own lease ends
-- (server time in ms: the latest of its holds'). Each reader's own lease is its score in the
-- readers set (the latest of its holds'), so one dead reader expires without cutting the
-- others short; the hash lives as long as the longest lease. Writers waiting for the lock are in a set of their
-- own, and while one is waiting no new reader gets in (writers are not starved).
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the readers (sorted set: holder id -> server time in ms its read lease ends)
-- KEYS[3]  the waiting writers (sorted set: holder id -> server time in ms it may wait until)
-- KEYS[4]  the fencing record (the last token issued; lives 5 s after a grant)
-- KEYS[5]  attempts given up on (set), so one that arrives late is refused
-- ARGV[1]  holder id
-- ARGV[2]  'r' for the read side, 'w' for the write side
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  attempt id
-- ARGV[5]  '1' to issue a fencing token (write side only)
-- ARGV[6]  waiter timeout in milliseconds for a writer that must wait; '0' not to wait
-- ARGV[7]  an earlier attempt of this acquisition whose reply was lost, or ''
-- ARGV[8]  re-entry of that side, as in acquire.lua
-- ARGV[9]  the server's boot check, or '' (as in acquire.lua, which also says what {-2} means)
-- ARGV[10]  the latest server time at which this request may act, or '' (as ARGV[9] of
--          acquire.lua: a later one does nothing and answers {-4})
--
-- Returns {1, count, token} when granted (token -1 without one), {0, retry} when the holder
-- must wait (retry: ms until the first lease or waiting writer's place in the way ends: the
-- writer's, the first reader's for a writer, the first waiting writer's for a reader; else
-- the hash's time left, -1 unknown), or
-- {-1} when a reader asks for the write side: waiting would deadlock.
local lock, readers, writers = KEYS[1], KEYS[2], KEYS[3]
local holder, side = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[3])
if arrived_late(ARGV[10]) then
  return {-4}
end
local left = boot_unverified(ARGV[9])
if left then
  return {-2, left}
end
if redis.call('SISMEMBER', KEYS[5], ARGV[4]) == 1 then
  return {0, redis.call('PTTL', lock)}
end
local now = now_ms()

purge_readers(lock, readers, now)
purge_writer(lock, readers, now)
redis.call('ZREMRANGEBYSCORE', writers, '-inf', now)
local holds_side = redis.call('HEXISTS', lock, side .. ':' .. holder) == 1
if (ARGV[8] == 'held' and not holds_side)
    or (holds_side and not may_reenter(lock, ARGV[8], ARGV[7], 'a:' .. side .. ':' .. holder,
      'e:' .. side .. ':' .. holder)) then
  return {0, redis.call('PTTL', lock)}
end
local mode = redis.call('HGET', lock, '~m')
if mode == 'read' and redis.call('ZCARD', readers) == 0 then
  redis.call('DEL', lock)
  mode = false
end

local rfield, wfield = 'r:' .. holder, 'w:' .. holder
local allowed
if side == 'w' then
  if mode == false or redis.call('HEXISTS', lock, wfield) == 1 then
    allowed = true
  elseif redis.call('HEXISTS', lock, rfield) == 1 then
    return {-1}
  end
else
  local writer_waiting = false
  for _, writer in ipairs(redis.call('ZRANGE', writers, 0, -1)) do
    if writer ~= holder then
      writer_waiting = true
    end
  end
  allowed = redis.call('HEXISTS', lock, rfield) == 1 or redis.call('HEXISTS', lock, wfield) == 1
    or (mode ~= 'write' and not writer_waiting)
end

if not allowed then
  local timeout = tonumber(ARGV[6])
  if side == 'w' and timeout > 0 then
    redis.call('ZADD', writers, now + timeout, holder)
    extend(writers, timeout)
  end
  -- Look again, at the latest, when the first thing in the way ends: the writer's lease, the
  -- first reader's (for a writer) or the first waiting writer's place (for a reader). A holder
  -- that crashed ends without a release, and nothing is published then.
  local retry = -1
  local function sooner(ends)
    if ends and (retry < 0 or tonumber(ends) - now < retry) then
      retry = tonumber(ends) - now
    end
  end
  sooner(redis.call('HGET', lock, '~w'))
  sooner(redis.call('ZRANGE', side == 'w' and readers or writers, 0, 0, 'WITHSCORES')[2])
  if retry < 0 then
    retry = redis.call('PTTL', lock)
  end
  return {0, retry}
end

local field = side == 'w' and wfield or rfield
local taken_over = recorded(lock, ARGV[7], 'a:' .. field, 'e:' .. field) and ARGV[7] or nil
local count = reenter(lock, field, ARGV[4], ARGV[7], 'a:' .. field, 'e:' .. field)
-- Each hold keeps its own lease: a re-entry's ends with it (see hold_ends).
add_hold_end(lock, field, ARGV[4], taken_over, now + lease)
if count == 1 then
  -- A new hold: its grant is recorded as such.
  redis.call('HSET', lock, 'a:' .. field, ARGV[4])
  redis.call('HDEL', lock, 'e:' .. field)
end
local token = -1
if side == 'w' then
  redis.call('HSET', lock, '~m', 'write')
  extend_writer(lock, now + lease)
  redis.call('ZREM', writers, holder)
  if ARGV[5] == '1' then
    token = fencing_token(lock, KEYS[4])
  end
else
  if mode == false then
    redis.call('HSET', lock, '~m', 'read')
  end
  -- A re-entry with a shorter lease never cuts the reader's earlier lease short.
  redis.call('ZADD', readers, 'GT', now + lease, holder)
end
-- The readers live as long as the lock: a reader whose entry went with an expired set while
-- the writer kept the hash alive would hold its read side for ever.
extend(lock, lease)
extend(readers, redis.call('PTTL', lock))
return {1, count, token}
