-- What a lock holds, read without changing anything: the helper of inspect.lua and
-- force_unlock.lua, sent in front of each.
--
-- With `layout` 'x', an exclusive or fair lock:
--   KEYS[1]  the lock: a single hold or a hash (see acquire.lua and fair_acquire.lua)
--   KEYS[2]  the fair lock's waiter queue
--   KEYS[3]  its waiter timeouts
--   KEYS[4]  attempts given up on (a single hold of one of them is nobody's)
-- With `layout` 'rw', a read-write lock (see rw_acquire.lua):
--   KEYS[1]  the lock hash
--   KEYS[2]  the readers
--   KEYS[3]  the waiting writers
-- With `layout` 'sem', a semaphore (see sem_acquire.lua):
--   KEYS[1]  the semaphore hash
--   KEYS[2]  the holders
--
-- Returns {fair, queued, limit, holder, side, count, lease, holder, side, count, lease, ...}:
-- `fair` 1 when a fair acquire granted the hold ('~k') or fair waiters are queued, else 0;
-- `queued` the waiters whose place is alive (fair waiters, or writers waiting); `limit` a
-- semaphore's permit count ('~p'), -1 for the other layouts; then per holder its id, its side
-- ('x' for an exclusive or fair hold, 'r', 'w', 's' for a permit), its hold count and its
-- lease left in ms (-1: no expiry). Nil when KEYS[1] holds data that is not a lock of that
-- layout.

-- The fields of an exclusive or fair lock's hash that are not holders ('~q', a waiter mark,
-- is written by earlier versions only).
local LOCK_FIELDS = {
  ['~a'] = true, ['~r'] = true, ['~f'] = true, ['~q'] = true, ['~k'] = true, ['~s'] = true,
}

-- Whether `value` is a hold count: a whole number above zero.
local function is_count(value)
  return value ~= false and string.match(value, '^[1-9]%d*$') ~= nil
end

-- The lease left until `ends` (server time in ms), no longer than the key's own `ttl`.
local function left_until(ends, now, ttl)
  local left = ends - now
  if ttl >= 0 and ttl < left then
    return ttl
  end
  return left
end

local function snapshot(layout, now)
  local lock = KEYS[1]
  local queued = 0
  if layout ~= 'sem' then
    queued = #redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf')
  end
  local found = {0, queued, -1}
  local held = redis.call('TYPE', lock)['ok']
  if held == 'none' then
    return found
  end
  local ttl = redis.call('PTTL', lock)
  local function add(holder, side, count, lease)
    table.insert(found, holder)
    table.insert(found, side)
    table.insert(found, count)
    table.insert(found, lease)
  end
  if layout == 'x' then
    if queued > 0 then
      found[1] = 1
    end
    if held == 'string' then
      local owner, attempt, lease = single_hold(redis.call('GET', lock))
      if not owner then
        return nil
      end
      -- A hold on a client lease that ran out is over (see acquire.lua).
      if redis.call('SISMEMBER', KEYS[4], attempt) == 0
        and not (lease and redis.call('EXISTS', lease) == 0) then
        add(owner, 'x', 1, time_left(lock, lease))
      end
      return found
    end
    if held ~= 'hash' then
      return nil
    end
    local lease = redis.call('HGET', lock, '~s')
    if lease then
      if redis.call('EXISTS', lease) == 0 then
        return found
      end
      ttl = time_left(lock, lease)
    end
    for _, field in ipairs(redis.call('HKEYS', lock)) do
      if field == '~k' then
        found[1] = 1
      elseif not LOCK_FIELDS[field] then
        local count = redis.call('HGET', lock, field)
        if string.sub(field, 1, 1) == '~' or not is_count(count) then
          return nil
        end
        add(field, 'x', tonumber(count), ttl)
      end
    end
    return found
  end
  if layout == 'sem' then
    local limit = held == 'hash' and redis.call('HGET', lock, '~p')
    if not limit then
      return nil
    end
    found[3] = tonumber(limit)
    for _, field in ipairs(redis.call('HKEYS', lock)) do
      local holder = string.match(field, '^r:(.*)$')
      if holder then
        local ends = tonumber(redis.call('ZSCORE', KEYS[2], holder) or now)
        if ends > now then
          add(holder, 's', tonumber(redis.call('HGET', lock, field)), left_until(ends, now, ttl))
        end
      end
    end
    return found
  end
  if held ~= 'hash' or redis.call('HEXISTS', lock, '~m') == 0 then
    return nil
  end
  local writer_ends = tonumber(redis.call('HGET', lock, '~w') or -1)
  for _, field in ipairs(redis.call('HKEYS', lock)) do
    local side, holder = string.match(field, '^([rw]):(.*)$')
    if side then
      local count = tonumber(redis.call('HGET', lock, field))
      if side == 'w' then
        if writer_ends < 0 then
          add(holder, 'w', count, ttl)
        elseif writer_ends > now then
          add(holder, 'w', count, left_until(writer_ends, now, ttl))
        end
      else
        local ends = tonumber(redis.call('ZSCORE', KEYS[2], holder) or now)
        if ends > now then
          add(holder, 'r', count, left_until(ends, now, ttl))
        end
      end
    end
  end
  return found
end
