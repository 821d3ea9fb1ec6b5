-- Acquires a reentrant lock for a holder.
--
-- KEYS[1]  the lock hash: field <holder> = hold count, '~a' = the attempt that granted the
--          hold, '~r' = the last re-entry's attempt, '~f' = token
-- KEYS[2]  the fencing record (the last token issued; lives 5 s after a grant)
-- KEYS[3]  attempts given up on (set), so one that arrives late is refused
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  attempt id (lets a caller whose reply was lost undo this attempt)
-- ARGV[4]  '1' to issue a fencing token
-- ARGV[5]  an earlier attempt of this acquisition whose reply was lost, or ''
-- ARGV[6]  re-entry: 'held' to re-enter only (grant nothing unless the holder already holds
--          the lock), 'free' to take only a new hold (a hold the holder still has counts as
--          another owner's), '' for either
-- ARGV[7]  the server's boot marker, or '' (see `boot_unverified`)
--
-- Returns {1, count, token} when the holder now holds the lock (token -1 without fencing),
-- {0, pttl} when another holder has it (pttl -1 when the key has no expiry), or {-2} when the
-- boot marker is missing: the client checks the server's uptime first.
local lock = KEYS[1]
local holder = ARGV[1]
if boot_unverified(ARGV[7]) then
  return {-2}
end
if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 1 then
  return {0, redis.call('PTTL', lock)}
end
local count
local holds = redis.call('HEXISTS', lock, holder) == 1
if ARGV[6] == 'held' and not holds then
  return {0, redis.call('PTTL', lock)}
end
if redis.call('EXISTS', lock) == 0 then
  count = 1
  redis.call('HSET', lock, holder, 1, '~a', ARGV[3])
elseif holds and may_reenter(lock, ARGV[6], ARGV[5], '~a', '~r') then
  count = reenter(lock, holder, ARGV[3], ARGV[5], '~a', '~r')
else
  return {0, redis.call('PTTL', lock)}
end
return granted(lock, ARGV[2], count, ARGV[4], KEYS[2])
