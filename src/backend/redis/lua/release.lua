-- Releases one hold (or all holds) of a holder, owner-checked; when the lock becomes free,
-- either grants it to a hand-off holder in the same step or publishes the release.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the fencing record
-- KEYS[3]  attempts given up on (a hand-off to one of them is not made)
-- ARGV[1]  releasing holder id
-- ARGV[2]  release channel
-- ARGV[3]  '1' to release every hold of the holder, '0' for one
-- ARGV[4]  hand-off holder id, or '' for none
-- ARGV[5]  hand-off lease in milliseconds
-- ARGV[6]  hand-off attempt id
-- ARGV[7]  '1' to issue a fencing token to the hand-off holder
-- ARGV[8]  attempt id that must be the lock's last recorded one, or '' for any: a release
--          for one particular hold (a lost one, or a retry) never frees a newer hold
--
-- Returns {0} when the holder does not hold the lock (nothing changed), {1, remaining} when
-- holds remain, {2} when the lock was freed and the release published, {3, token} when it was
-- handed off (token -1 without fencing). {2, n} also says how many subscribers the release
-- reached.
local lock = KEYS[1]
local holder = ARGV[1]
if not last_attempt_is(lock, ARGV[8]) then
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
local next = ARGV[4]
if next ~= '' and redis.call('SISMEMBER', KEYS[3], ARGV[6]) == 0 then
  redis.call('HSET', lock, next, 1, '~a', ARGV[6])
  redis.call('PEXPIRE', lock, ARGV[5])
  local token = -1
  if ARGV[7] == '1' then
    token = fencing_token(lock, KEYS[2])
  end
  return {3, token}
end
return {2, publish(ARGV[2], 'released')}
