-- Takes a shared grant for an attempt: a reader of a read-write lock, or a permit of a
-- semaphore; or extends one.
--
-- Shared grants are the members of a sorted set, each an attempt id, scored with the server
-- time (ms) its lease ends. A grant whose lease ended is dropped by the next script that looks.
-- A semaphore grants while fewer than its permits are held. A reader is granted while nobody
-- holds the write side and no writer waits in the queue, unless it is nested in the write grant
-- of its own holder.
--
-- KEYS[1]  the grants (sorted set)
-- KEYS[2]  attempts given up on (a set)
-- KEYS[3]  read: the write side's owner record (see acquire.lua)
-- KEYS[4]  read: the waiting writers' queue, KEYS[5] their places (see acquire.lua)
-- KEYS[#]  with a quarantine check (ARGV[4]): the run marker
-- ARGV[1]  the attempt id
-- ARGV[2]  the lease, in ms
-- ARGV[3]  the latest server time (ms) at which the request may act, or '' (see acquire.lua)
-- ARGV[4]  the quarantine check, or '' (see `quarantined` in the prelude)
-- ARGV[5]  '' to acquire, or a grant to extend to ARGV[2] from now
-- ARGV[6]  a semaphore's permits; '' for a reader
-- ARGV[7]  read: the holder
-- ARGV[8]  read: the holder's write grant of this lock, or ''
--
-- Returns {1, -1} granted or extended; {0, retry} refused (ms until what is in the way may end,
-- -1 unknown), or for an extend: the grant is not held; {-2, left} the server run is in
-- quarantine; {-4} the request arrived too late to act.
local grants, void, attempt = KEYS[1], KEYS[2], ARGV[1]
local lease, now = tonumber(ARGV[2]), now_ms()
if ARGV[3] ~= '' and now > tonumber(ARGV[3]) then
  return {-4}
end
if type(redis.pcall('ZREMRANGEBYSCORE', grants, '-inf', now)) == 'table' then
  return error({err = 'WRONGTYPE ' .. grants .. ' holds a ' .. redis.call('TYPE', grants).ok
    .. ', not tower-lock shared grants (a hash is a lock of an earlier tower-lock version)'})
end
if ARGV[5] ~= '' then
  if not redis.call('ZSCORE', grants, ARGV[5]) then
    return {0, -1}
  end
  redis.call('ZADD', grants, 'GT', now + lease, ARGV[5])
  extend(grants, lease)
  return {1, -1}
end
local left = quarantined(ARGV[4], KEYS[#KEYS])
if left then
  return {-2, left}
end
if redis.call('SISMEMBER', void, attempt) == 1 then
  return {0, -1}
end
if redis.call('ZSCORE', grants, attempt) then
  -- The same request, sent again: it holds the grant already.
  return {1, -1}
end
if redis.call('EXISTS', void) == 1 then
  -- Late copies of attempts their clients gave up on: nobody holds them.
  for _, grant in ipairs(redis.call('ZRANGE', grants, 0, -1)) do
    if redis.call('SISMEMBER', void, grant) == 1 then
      redis.call('ZREM', grants, grant)
    end
  end
end
local retry
if ARGV[6] ~= '' then
  if redis.call('ZCARD', grants) >= tonumber(ARGV[6]) then
    retry = tonumber(redis.call('ZRANGE', grants, 0, 0, 'WITHSCORES')[2]) - now
  end
else
  local writer = owner(KEYS[3])
  if writer and writer ~= ARGV[8] then
    retry = redis.call('PTTL', KEYS[3])
  elseif not writer then
    purge_queue(KEYS[4], KEYS[5], now)
    local head = redis.call('LINDEX', KEYS[4], 0)
    if head and head ~= ARGV[7] then
      retry = tonumber(redis.call('ZSCORE', KEYS[5], head)) - now
    end
  end
end
if retry then
  return {0, retry}
end
redis.call('ZADD', grants, now + lease, attempt)
extend(grants, lease)
return {1, -1}
