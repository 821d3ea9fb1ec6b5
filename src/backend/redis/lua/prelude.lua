-- Helpers shared by the scripts, sent in front of each (or where it says `-- @helpers`), after
-- the `publish` helper of the transport (PUBLISH on a node, SPUBLISH on a Cluster).

-- The server's clock in milliseconds: scripts never trust a client's clock.
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

-- The attempt and the fencing token (or nil) of the owner record at `key`, or nil when there is
-- none. An owner record is a string, '<attempt>' or '<attempt>~<token>', and attempt ids end in
-- '#<number>'. Anything else at the key is an error that names what is there: a hash is a lock of
-- the protocol before records per grant (it counted holds per holder), and it is never granted
-- over.
local function owner(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then
    return error({err = 'WRONGTYPE ' .. key .. ' holds a ' .. redis.call('TYPE', key).ok
      .. ', not a tower-lock owner record (a hash is a lock of an earlier tower-lock version)'})
  end
  if not value then
    return nil
  end
  local attempt, token = string.match(value, '^(.+#%d+)~(%d+)$')
  if attempt then
    return attempt, token
  end
  if string.find(value, '#%d+$') then
    return value
  end
  return error({err = 'WRONGTYPE ' .. key .. ' holds a string that is not a tower-lock owner record'})
end

-- Whether this server run may have forgotten grants whose holders still believe in them: the
-- milliseconds its quarantine has left, or false. `check` is '' (no quarantine), or
-- '<quarantine ms>:<run id>' with the run id the connection saw when it opened ('' for a
-- connection the backend did not open, whose run this script reads). The run marker `marker`
-- holds '<run id> <origin ms>' for the whole run: when its quarantine began, its start, or, on
-- a replica promoted to master (the old master's last grants may not have reached it), when a
-- script first saw it. Every process waits its own quarantine from that one origin, whoever
-- asked first: the marker never says a quarantine is over, as processes' lengths differ.
local function quarantined(check, marker)
  if check == '' then
    return false
  end
  local length, run = string.match(check, '^(%d+):(%w*)$')
  local seen = redis.call('GET', marker) or ''
  local origin = run ~= '' and tonumber(string.match(seen, '^' .. run .. ' (%d+)$'))
  if not origin then
    local server = redis.call('INFO', 'server')
    run = string.match(server, 'run_id:(%w+)')
    origin = tonumber(string.match(seen, '^' .. run .. ' (%d+)$'))
    if not origin then
      -- The second the run started in (its cached clock less its uptime, both whole seconds
      -- of one reading): the same for every script, so every marker has the same origin, the
      -- end of that second.
      local started = math.floor(tonumber(string.match(server, 'server_time_usec:(%d+)')) / 1000000)
        - tonumber(string.match(server, 'uptime_in_seconds:(%d+)'))
      origin = (started + 1) * 1000
      if string.match(redis.call('INFO', 'replication'), 'second_repl_offset:(-?%d+)') ~= '-1' then
        origin = now_ms()
      end
      redis.call('SET', marker, run .. ' ' .. origin, 'PX', 86400000)
    end
  end
  local left = origin + tonumber(length) - now_ms()
  return left > 0 and left
end

-- A new fencing token for the lock whose fencing record is `fence`: the server's time in ms
-- times 1000, or one more than the last token issued when that is higher (grants within one
-- millisecond, a clock that stepped back a little). The record lives 5 s, so nothing of a lock
-- outlives it for long; tokens still rise after a restart or a failover, which lose it. Exact in
-- Lua's numbers until the year 2255.
local function new_token(fence)
  local token = now_ms() * 1000
  local last = tonumber(redis.call('GET', fence) or 0)
  if last >= token then
    token = last + 1
  end
  token = string.format('%d', token)
  redis.call('SET', fence, token, 'PX', 5000)
  return token
end

-- Drops the waiters whose place was not kept alive until `now`. `queue` lists holders in the
-- order they joined; `places` gives each the server time (ms) its place lives until.
local function purge_queue(queue, places, now)
  for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', places, '-inf', now)) do
    redis.call('LREM', queue, 0, waiter)
    redis.call('ZREM', places, waiter)
  end
end

-- Records `attempt` as given up on by its client, for `ms` (its lease: it can arrive no later),
-- so that it takes nothing should it still arrive, and anything it took counts as free.
local function give_up(void, attempt, ms)
  redis.call('SADD', void, attempt)
  extend(void, ms)
end
