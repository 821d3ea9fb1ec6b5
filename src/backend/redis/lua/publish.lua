
-- Announces a release on the lock's channel, to every subscriber of the node.
local function publish(channel, message)
  return redis.call('PUBLISH', channel, message)
end
