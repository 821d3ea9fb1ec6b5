
-- Announces a release on the lock's channel, to the subscribers of the shard owning the lock's
-- slot (Redis Cluster: the channel carries the lock's hash tag).
local function publish(channel, message)
  return redis.call('SPUBLISH', channel, message)
end
