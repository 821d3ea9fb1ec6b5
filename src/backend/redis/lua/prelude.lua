-- Helpers shared by the scripts: each script is sent with this prelude in front of it.

-- The server's clock in milliseconds: scripts never trust client clocks.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Whether a request that may act until `not_after` (server ms; '' for no bound) arrived after
-- that: see ARGV[9] of acquire.lua.
local function arrived_late(not_after)
  return not_after ~= '' and now_ms() > tonumber(not_after)
end

-- How long a boot marker lives, in milliseconds: a marker that expired costs one uptime check.
local BOOT_MARKER_MS = 86400000

-- Whether this server run may have forgotten locks whose holders still run (it started less
-- than a quarantine ago): the milliseconds its quarantine has left, or false. `check` is '' (no
-- check) or '<quarantine in ms>:<boot marker key>'. The marker holds LASTSAVE of a server run
-- seen up for a whole quarantine. LASTSAVE is set to the time of each start and of each save,
-- so a run restarted from a snapshot or an append-only file (which keep the marker) never
-- matches it; a save costs one uptime check. The marker is written only once the clock has
-- left LASTSAVE's second: a run that starts later starts in a later second.
local function boot_unverified(check)
  if check == '' then
    return false
  end
  local quarantine, marker = string.match(check, '^(%d+):(.*)$')
  local started = redis.call('LASTSAVE')
  if tonumber(redis.call('GET', marker)) == started then
    return false
  end
  -- uptime_in_seconds may be one more than the real uptime: one second is taken off.
  local uptime = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
  local left = tonumber(quarantine) - math.max(uptime - 1, 0) * 1000
  if left > 0 then
    return left
  end
  if tonumber(redis.call('TIME')[1]) > started then
    redis.call('SET', marker, tostring(started), 'PX', BOOT_MARKER_MS)
  end
  return false
end

-- Makes `key` live at least `ms` more milliseconds, never shortening it.
local function extend(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Records `attempt` in the set `void` of attempts given up on, so that its request, should it
-- still arrive, takes nothing: for `ms` milliseconds, and with `pxat` (server ms, '' or nil for
-- none) until after that moment. `pxat` is the absolute expiry of the attempt's single hold
-- (`SET … PXAT`, see acquire.lua), so a late `SET` never outlives the record that names its
-- attempt: once the record is gone, so is anything the `SET` could create.
local function give_up(void, attempt, ms, pxat)
  redis.call('SADD', void, attempt)
  extend(void, ms)
  if pxat and pxat ~= '' then
    local at = tonumber(pxat) + 1
    if redis.call('PTTL', void) < at - now_ms() then
      redis.call('PEXPIREAT', void, at)
    end
  end
end

-- The same for a lock, which always has a lease: one command from Redis 7 on (PEXPIRE's GT
-- option), two before. GT leaves a key without a lease as it is: should a lock ever lack one,
-- it gets one here (a second command only when GT changed nothing).
local function extend_lease(lock, ms)
  if (redis.REDIS_VERSION_NUM or 0) < 0x070000 then
    extend(lock, ms)
  elseif redis.call('PEXPIRE', lock, ms, 'GT') == 0 and redis.call('PTTL', lock) == -1 then
    redis.call('PEXPIRE', lock, ms)
  end
end

-- How long a lock's fencing record outlives the lock's last grant, in milliseconds.
local FENCE_RECORD_MS = 5000

-- The lock's fencing token; a new one when the lock has none yet: the server's time in
-- milliseconds times 1000, or one more than the last token issued for this lock name when that
-- is higher (grants within one millisecond, or a clock that stepped back a little). The last
-- token is kept in `record` for FENCE_RECORD_MS after each grant, so nothing of a lock outlives
-- it for longer, and tokens still rise after a restart or a failover, which lose the record.
-- At 2^53 (exact in Lua's numbers) this works until the year 2255.
local function fencing_token(lock, record)
  local token = redis.call('HGET', lock, '~f')
  if token then
    return tonumber(token)
  end
  token = now_ms() * 1000
  local last = tonumber(redis.call('GET', record) or 0)
  if last >= token then
    token = last + 1
  end
  redis.call('SET', record, string.format('%d', token), 'PX', FENCE_RECORD_MS)
  redis.call('HSET', lock, '~f', string.format('%d', token))
  return token
end

-- The reply of an acquire that granted `count` holds: makes the lease last at least `lease`
-- (a re-entry with a shorter lease never cuts the holder's earlier lease short; a first hold
-- has no earlier lease) and, when `fencing` is '1', adds the lock's fencing token (-1 without
-- one).
local function granted(lock, lease, count, fencing, record)
  if count == 1 then
    redis.call('PEXPIRE', lock, lease)
  else
    extend(lock, lease)
  end
  local token = -1
  if fencing == '1' then
    token = fencing_token(lock, record)
  end
  return {1, count, token}
end

-- Whether `attempt` is one of the records `grant` and `reentry` (field names; the same one
-- for a read-write lock's side).
local function recorded(lock, attempt, grant, reentry)
  return attempt ~= '' and (redis.call('HGET', lock, grant) == attempt
    or redis.call('HGET', lock, reentry) == attempt)
end

-- Whether `mode` (the acquire's re-entry argument) lets a holder add a hold to the one it
-- has: 'held' and '' do; 'free' does not, except to take over the hold of `supersedes`, an
-- earlier attempt of the same acquisition whose reply was lost.
local function may_reenter(lock, mode, supersedes, grant, reentry)
  return mode ~= 'free' or recorded(lock, supersedes, grant, reentry)
end

-- One more hold in `field` of `lock`, taken by `attempt` and recorded in the field `reentry`
-- (the hold's first grant stays recorded in `grant`) — unless `supersedes` (an earlier
-- attempt of the same acquisition whose reply was lost) is recorded: that one took the hold,
-- and this attempt takes it over instead of adding a second. Returns the count.
local function reenter(lock, field, attempt, supersedes, grant, reentry)
  local count
  if recorded(lock, supersedes, grant, reentry) then
    count = tonumber(redis.call('HGET', lock, field))
    if redis.call('HGET', lock, grant) == supersedes then
      redis.call('HSET', lock, grant, attempt)
      return count
    end
    -- A re-entry taken over when it is the only hold left (the others were released
    -- meanwhile) is the grant from then on: its holder names it when it releases.
    if count == 1 then
      redis.call('HSET', lock, grant, attempt)
    end
  else
    count = redis.call('HINCRBY', lock, field, 1)
  end
  redis.call('HSET', lock, reentry, attempt)
  return count
end

-- The client lease a single hold lives on (see acquire.lua): what follows its first newline,
-- or nil.
local function single_lease(value)
  local at = string.find(value, '\n', 1, true)
  return at and string.sub(value, at + 1)
end

-- The holder and the attempt of a single hold (see acquire.lua), or nil when `value` is not
-- one; then the client lease it lives on, or nil.
local function single_hold(value)
  local length, rest = string.match(value, '^(%d+):(.*)$')
  if not length then
    return nil
  end
  length = tonumber(length)
  local lease = single_lease(rest)
  if lease then
    rest = string.sub(rest, 1, #rest - #lease - 1)
  end
  return string.sub(rest, 1, length), string.sub(rest, length + 1), lease
end

-- Whether the client lease `lease` (nil or false: none) that a lock's holds live on has run
-- out: then nobody holds the lock, and its key is deleted.
local function lapsed(lock, lease)
  if lease and redis.call('EXISTS', lease) == 0 then
    redis.call('DEL', lock)
    return true
  end
  return false
end

-- The client lease the holds of `lock` live on, a single hold's or a hash's, or nil.
local function lock_lease(lock)
  local single = redis.pcall('GET', lock)
  if type(single) == 'string' then
    return single_lease(single)
  end
  if not single then
    return nil
  end
  local lease = redis.pcall('HGET', lock, '~s')
  return type(lease) == 'string' and lease or nil
end

-- The time `lock` has left: its own, or its client lease's when that ends sooner.
local function time_left(lock, lease)
  local ttl = redis.call('PTTL', lock)
  if lease then
    local left = redis.call('PTTL', lease)
    if left >= 0 and (ttl < 0 or left < ttl) then
      return left
    end
  end
  return ttl
end

-- Whether the hold a renewal names is the lock's: `named` is an owner prefix followed by the
-- attempt that granted the hold, or by nothing for any hold of that holder; `single` is the
-- lock's value when it is a string, else false. The attempt must be recorded for the holder's
-- holds, as their grant ('~a') or their last re-entry ('~r': on a Redlock node where another
-- client of the same holder held first, the attempt is a re-entry there). A hold the holder
-- took anew (which a late renewal must leave its own lease) records neither. Answers whether
-- it is and the client lease the lock's holds live on, or the error of a key that holds
-- another type of value.
local function holds_named(lock, single, named)
  local colon = string.find(named, ':', 1, true)
  local ends = colon + tonumber(string.sub(named, 1, colon - 1))
  local attempt = string.sub(named, ends + 1)
  if single then
    if string.find(single, named, 1, true) ~= 1 then
      return false
    end
    -- The attempt is the single hold's whole attempt, not the start of a longer one.
    local after = string.byte(single, #named + 1)
    return attempt == '' or after == nil or after == 10, single_lease(single)
  end
  local found = redis.pcall('HMGET', lock, string.sub(named, colon + 1, ends), '~s', '~a', '~r')
  if found.err then
    return found
  end
  return found[1] ~= false and (attempt == '' or found[3] == attempt or found[4] == attempt),
    found[2]
end

-- Makes the lock a hash if it is a single hold (keeping its lease), or deletes it when that
-- hold's attempt is in `void` (given up on: nobody holds it). False when the key holds a
-- string that is not a lock.
local function as_hash(lock, void)
  local single = redis.pcall('GET', lock)
  if type(single) ~= 'string' then
    return true
  end
  local owner, attempt, lease = single_hold(single)
  if not owner then
    return false
  end
  local ttl = redis.call('PTTL', lock)
  redis.call('DEL', lock)
  -- A hold with no time left (the key is read in its last millisecond) is over: every lock
  -- key has a lease, and one written without it would never expire.
  if ttl > 0 and redis.call('SISMEMBER', void, attempt) == 0 then
    redis.call('HSET', lock, owner, 1, '~a', attempt)
    if lease then
      redis.call('HSET', lock, '~s', lease)
    end
    redis.call('PEXPIRE', lock, ttl)
  end
  return true
end

-- Whether the lock's hold was granted by `attempt` ('' matches any): a release made on behalf
-- of one particular hold changes nothing once the holder has acquired the lock anew.
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

-- The lease of each hold of one side of a holder of a read-write lock (or of a semaphore's
-- permit), in the field 'l:<field>' of the lock: a JSON list of, for each hold in the order they
-- were taken, the attempt that took it and the server time (ms) its lease ends. The holder's
-- own end (its score, or the writer's '~w') is the latest of them, so a release that names its
-- hold takes that hold's lease away and leaves the others theirs. A holder without the field
-- (taken by a version that kept one lease per holder) keeps the end it has.
local function hold_ends(lock, field)
  local list = redis.call('HGET', lock, 'l:' .. field)
  return list and cjson.decode(list) or {}
end

-- Stores `list` (see hold_ends) and returns the latest end in it, or nil when it is empty.
local function save_ends(lock, field, list)
  local latest
  for i = 2, #list, 2 do
    local ends = tonumber(list[i])
    if not latest or ends > latest then
      latest = ends
    end
  end
  if latest then
    redis.call('HSET', lock, 'l:' .. field, cjson.encode(list))
  else
    redis.call('HDEL', lock, 'l:' .. field)
  end
  return latest
end

-- The position in `list` of the hold `attempt` took, or else of the hold whose lease ends
-- first (the first such in the list), or nil when the list is empty.
local function hold_at(list, attempt)
  local at
  for i = 1, #list, 2 do
    if list[i] == attempt then
      return i
    end
    if not at or tonumber(list[i + 1]) < tonumber(list[at + 1]) then
      at = i
    end
  end
  return at
end

-- Records the lease of a hold of `field` that `attempt` took until `ends` (server ms): a new
-- hold, or with `taken_over` (an earlier attempt of the same acquisition, recorded as having
-- taken a hold) that hold, now `attempt`'s, whose lease ends at the later of the two.
local function add_hold_end(lock, field, attempt, taken_over, ends)
  local list = hold_ends(lock, field)
  local at = taken_over and hold_at(list, taken_over)
  if at then
    list[at] = attempt
    list[at + 1] = string.format('%d', math.max(tonumber(list[at + 1]), ends))
  else
    list[#list + 1] = attempt
    list[#list + 1] = string.format('%d', ends)
  end
  save_ends(lock, field, list)
end

-- Makes every hold of `field` last until at least `ends` (server ms): a renewal keeps all of
-- them alive.
local function renew_hold_ends(lock, field, ends)
  local list = hold_ends(lock, field)
  for i = 2, #list, 2 do
    if tonumber(list[i]) < ends then
      list[i] = string.format('%d', ends)
    end
  end
  save_ends(lock, field, list)
end

-- Gives back one hold counted in `field` (every hold, with `all`) for an undo of `attempt`
-- ('' for any hold): the record it must match is the hold's grant ('a:<field>') or, for one
-- hold, its last re-entry ('e:<field>'), and goes with it. An attempt that matches neither is
-- remembered in the set `void` for `void_ms`, so that it is refused should it still arrive.
-- With `void_ms` 0 it is the release of the hold `attempt` granted instead: only the grant's
-- record matches, a mismatch (the holder took the lock anew) is not remembered, and the record
-- stays while holds remain. The lease that goes with the hold given back is that of the hold
-- `hold` took (an undo: `attempt`'s), or else the one that ends first (see hold_ends).
-- Returns nil when nothing was given back, otherwise how many holds remain and, when some do,
-- the latest end of their leases (nil when not recorded); the last takes its records with it.
local function give_back_attempt(lock, field, all, attempt, void, void_ms, hold)
  local grant, reentry = 'a:' .. field, 'e:' .. field
  local undo = tonumber(void_ms) > 0
  local record
  if attempt ~= '' then
    if redis.call('HEXISTS', lock, field) == 1 then
      if redis.call('HGET', lock, grant) == attempt then
        record = grant
      elseif undo and not all and redis.call('HGET', lock, reentry) == attempt then
        record = reentry
      end
    end
    if not record then
      if undo then
        give_up(void, attempt, void_ms)
      end
      return nil
    end
  end
  local remaining = give_back(lock, field, all)
  if not remaining then
    return nil
  end
  if remaining > 0 then
    if record and undo then
      redis.call('HDEL', lock, record)
    end
    local list = hold_ends(lock, field)
    local at = hold_at(list, undo and attempt or hold)
    if at then
      table.remove(list, at)
      table.remove(list, at)
    end
    return remaining, save_ends(lock, field, list)
  end
  redis.call('HDEL', lock, field, grant, reentry, 'l:' .. field)
  return remaining
end

-- Drops the readers (or a semaphore's holders) in `readers` (holder id -> server time in ms
-- its lease ends) whose lease ended by `now`, with their holds and records in `lock`.
local function purge_readers(lock, readers, now)
  for _, reader in ipairs(redis.call('ZRANGEBYSCORE', readers, '-inf', now)) do
    redis.call('HDEL', lock, 'r:' .. reader, 'a:r:' .. reader, 'e:r:' .. reader, 'l:r:' .. reader)
    redis.call('ZREM', readers, reader)
  end
end

-- Drops the writer of a read-write lock whose own lease ('~w', server time in ms) ended by
-- `now`; readers keep theirs. A writer's hold must not live on because a reader (the writer
-- itself, after a downgrade) keeps the lock's key alive.
local function purge_writer(lock, readers, now)
  local ends = redis.call('HGET', lock, '~w')
  if not ends or tonumber(ends) > now then
    return
  end
  for _, field in ipairs(redis.call('HKEYS', lock)) do
    local prefix = string.sub(field, 1, 4)
    if string.sub(field, 1, 2) == 'w:' or prefix == 'a:w:' or prefix == 'e:w:'
        or prefix == 'l:w:' then
      redis.call('HDEL', lock, field)
    end
  end
  redis.call('HDEL', lock, '~w')
  if redis.call('ZCARD', readers) == 0 then
    redis.call('DEL', lock)
  else
    redis.call('HSET', lock, '~m', 'read')
  end
end

-- Makes the writer's own lease ('~w') last until at least `ends` (server time in ms).
local function extend_writer(lock, ends)
  local current = tonumber(redis.call('HGET', lock, '~w') or 0)
  if ends > current then
    redis.call('HSET', lock, '~w', ends)
  end
end

-- Drops the waiters of a fair queue whose place was not kept alive until `now`.
local function purge_waiters(queue, timeouts, now)
  for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', timeouts, '-inf', now)) do
    redis.call('LREM', queue, 0, waiter)
    redis.call('ZREM', timeouts, waiter)
  end
end

