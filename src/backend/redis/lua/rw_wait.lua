-- Keeps a waiting writer's place alive, or takes it out (letting blocked readers in).
--
-- KEYS[1]  the waiting writers
-- ARGV[1]  holder id
-- ARGV[2]  waiter timeout in milliseconds, or '0' to stop waiting
-- ARGV[3]  release channel
--
-- Returns 1 when the writer is still waiting, 0 when it is not (purged, or it left).
local writers = KEYS[1]
local holder = ARGV[1]
local timeout = tonumber(ARGV[2])
if timeout == 0 then
  if redis.call('ZREM', writers, holder) == 1 then
    publish(ARGV[3], 'released')
  end
  return 0
end
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', writers, '-inf', now)
if redis.call('ZADD', writers, 'XX', 'CH', now + timeout, holder) == 0
  and not redis.call('ZSCORE', writers, holder) then
  return 0
end
extend(writers, timeout)
return 1
