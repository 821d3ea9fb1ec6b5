-- Extends one side of a holder's read-write lock, owner-checked.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the readers
-- ARGV[1]  holder id
-- ARGV[2]  'r' or 'w'
-- ARGV[3]  lease in milliseconds
--
-- Returns 1 when renewed, 0 when the holder no longer holds that side.
local lock, readers = KEYS[1], KEYS[2]
local holder, side = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[3])
if redis.call('HEXISTS', lock, side .. ':' .. holder) == 0 then
  return 0
end
if side == 'r' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('ZADD', readers, now + lease, holder)
  if redis.call('PTTL', readers) < lease then
    redis.call('PEXPIRE', readers, lease)
  end
end
if redis.call('PTTL', lock) < lease then
  redis.call('PEXPIRE', lock, lease)
end
return 1
