-- Undoes one acquire attempt whose reply was lost: if the holder's last recorded attempt is
-- this one, gives back the hold it took (freeing and publishing when it was the last).
--
-- KEYS[1]  the lock hash
-- ARGV[1]  holder id
-- ARGV[2]  attempt id
-- ARGV[3]  release channel
--
-- Returns 1 when a hold was given back, 0 when the attempt had taken nothing (or something
-- newer happened since).
local lock = KEYS[1]
if redis.call('HGET', lock, '~a') ~= ARGV[2] or redis.call('HEXISTS', lock, ARGV[1]) == 0 then
  return 0
end
if redis.call('HINCRBY', lock, ARGV[1], -1) <= 0 then
  redis.call('DEL', lock)
  redis.call('PUBLISH', ARGV[3], 'released')
else
  redis.call('HDEL', lock, '~a')
end
return 1
