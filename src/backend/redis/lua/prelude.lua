-- Helpers shared by the scripts: each script is sent with this prelude in front of it.

-- The server's clock in milliseconds: scripts never trust client clocks.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Makes `key` live at least `ms` more milliseconds, never shortening it.
local function extend(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- The lock's fencing token, the next one from `counter` when the lock has none yet.
local function fencing_token(lock, counter)
  local token = redis.call('HGET', lock, '~f')
  if not token then
    token = redis.call('INCR', counter)
    redis.call('HSET', lock, '~f', token)
  end
  return tonumber(token)
end

-- The reply of an acquire that granted `count` holds: makes the lease last at least `lease`
-- (a re-entry with a shorter lease never cuts the holder's earlier lease short; a first hold
-- has no earlier lease) and, when `fencing` is '1', adds the lock's fencing token (-1 without
-- one).
local function granted(lock, lease, count, fencing, counter)
  if count == 1 then
    redis.call('PEXPIRE', lock, lease)
  else
    extend(lock, lease)
  end
  local token = -1
  if fencing == '1' then
    token = fencing_token(lock, counter)
  end
  return {1, count, token}
end

-- One more hold in `field` of `lock`, taken by `attempt` — unless `supersedes` (an earlier
-- attempt of the same acquisition whose reply was lost) is the lock's last attempt: that one
-- took the hold, and this attempt takes it over instead of adding a second. Returns the count.
local function reenter(lock, field, attempt, supersedes)
  local count
  if supersedes ~= '' and redis.call('HGET', lock, '~a') == supersedes then
    count = tonumber(redis.call('HGET', lock, field))
  else
    count = redis.call('HINCRBY', lock, field, 1)
  end
  redis.call('HSET', lock, '~a', attempt)
  return count
end

-- Whether the lock's last recorded attempt is `attempt` ('' matches any): a release made on
-- behalf of one particular hold changes nothing once the holder has acquired the lock anew.
local function last_attempt_is(lock, attempt)
  return attempt == '' or redis.call('HGET', lock, '~a') == attempt
end

-- Gives back one hold counted in `field` (every hold, with `all`): nil when there is none,
-- otherwise how many remain.
local function give_back(lock, field, all)
  if redis.call('HEXISTS', lock, field) == 0 then
    return nil
  end
  if all then
    return 0
  end
  return redis.call('HINCRBY', lock, field, -1)
end

-- Drops the waiters of a fair queue whose place was not kept alive until `now`.
local function purge_waiters(queue, timeouts, now)
  for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', timeouts, '-inf', now)) do
    redis.call('LREM', queue, 0, waiter)
    redis.call('ZREM', timeouts, waiter)
  end
end

