-- Frees a lock whoever holds it, for an operator: deletes every hold and announces the
-- release, so that waiters everywhere look again. A fair lock keeps its queue (its head is
-- woken by name, as fair_release.lua does), a read-write lock its waiting writers; a
-- semaphore's permits all come back. Holders
-- learn of it at their next renewal (a hold on a client lease, through the lease's set of
-- revoked holds). Sent with snapshot.lua in front of it.
--
-- KEYS     as snapshot.lua says for the layout
-- ARGV[1]  the layout: 'x' (exclusive or fair lock), 'rw' (read-write lock) or 'sem'
--          (semaphore)
-- ARGV[2]  release channel
--
-- Returns what the lock held just before, as snapshot.lua returns it, or a WRONGTYPE error
-- (nothing changed) when the lock's key holds data that is not a lock of that layout.
local now = now_ms()
local found = snapshot(ARGV[1], now)
if not found then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
local message = 'released'
if ARGV[1] ~= 'x' then
  if redis.call('DEL', KEYS[1], KEYS[2]) == 0 then
    return found
  end
else
  local lease = lock_lease(KEYS[1])
  if redis.call('DEL', KEYS[1]) == 0 then
    return found
  end
  -- Holds on a client lease are renewed by the lease key alone: their client reads the ones
  -- cleared here from the fields of the hash `<lease key>:revoked` at its next renewal (the
  -- hash lives no longer than the lease key would without another renewal).
  local left = lease and redis.call('PTTL', lease) or -2
  if left > 0 then
    local revoked = lease .. ':revoked'
    for i = 4, #found, 4 do
      redis.call('HSET', revoked, found[i] .. '\n' .. KEYS[1], 1)
    end
    extend(revoked, left)
  end
  purge_waiters(KEYS[2], KEYS[3], now)
  message = redis.call('LINDEX', KEYS[2], 0) or 'released'
end
publish(ARGV[2], message)
return found
