-- Resolves an acquire attempt whose reply was lost. If the attempt took the lock (it is the
-- recorded grant or last re-entry of the holder's hold), gives back the hold it took, freeing
-- and publishing when it was the last; otherwise its record goes (the grant's is kept, naming
-- no attempt: '' in '~a'). If it took nothing yet, records it as given up, so that the
-- request, should it still arrive, is refused.
--
-- KEYS[1]  the lock: a single hold or a hash (see acquire.lua)
-- KEYS[2]  attempts given up on (set)
-- KEYS[3]  optional, for a fair lock: its waiter queue; KEYS[4] then its waiter timeouts
-- ARGV[1]  holder id
-- ARGV[2]  attempt id
-- ARGV[3]  release channel
-- ARGV[4]  how long to remember a given-up attempt, in milliseconds (its lease)
-- ARGV[5]  '', or when the attempt's single hold would end (the `PXAT` of its `SET`, server
--          ms): the attempt is remembered until then at least
--
-- Returns 1 when a hold was given back, 0 when the attempt had taken nothing.
local lock = KEYS[1]
-- Frees the lock and wakes who is next: the head of a fair lock's queue (each fair waiter
-- listens for its own turn), anyone waiting for another lock.
local function free()
  redis.call('DEL', lock)
  local head
  if KEYS[3] then
    purge_waiters(KEYS[3], KEYS[4], now_ms())
    head = redis.call('LINDEX', KEYS[3], 0)
  end
  publish(ARGV[3], head or 'released')
end
local single = redis.pcall('GET', lock)
if type(single) == 'string' then
  local owner, attempt = single_hold(single)
  if owner == ARGV[1] and attempt == ARGV[2] then
    free()
    return 1
  end
  give_up(KEYS[2], ARGV[2], ARGV[4], ARGV[5])
  return 0
end
local holds = redis.call('HEXISTS', lock, ARGV[1]) == 1
-- The record of the attempt: a re-entry's, or the grant's.
local record
if holds and redis.call('HGET', lock, '~r') == ARGV[2] then
  record = '~r'
elseif holds and redis.call('HGET', lock, '~a') == ARGV[2] then
  record = '~a'
else
  give_up(KEYS[2], ARGV[2], ARGV[4], ARGV[5])
  return 0
end
if redis.call('HINCRBY', lock, ARGV[1], -1) <= 0 then
  free()
elseif record == '~a' then
  -- Holds remain (joined through another client): the grant's record stays, naming no
  -- attempt (a lock's hash has '~a' for as long as it exists: it tells a lock from foreign
  -- data).
  redis.call('HSET', lock, '~a', '')
else
  redis.call('HDEL', lock, record)
end
return 1
