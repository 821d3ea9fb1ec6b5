-- Takes the owner record of a plain, fair or write lock for an attempt, or extends a grant of it.
--
-- The owner record is a string at KEYS[1], '<attempt>' or '<attempt>~<token>', whose TTL is the
-- grant's lease. The client's first try at a plain lock it believes free writes the same record
-- with `SET KEYS[1] <attempt> NX PXAT <end>`; this script runs when that found the key taken, and
-- for every other acquire. A fair or write acquire keeps the order of a waiter queue; a write
-- acquire also waits for the readers (see share.lua).
--
-- KEYS[1]  the owner record
-- KEYS[2]  the fencing record: the last token issued for the lock, kept 5 s
-- KEYS[3]  attempts given up on (a set): one of them takes nothing, and holds nothing
-- KEYS[4]  fair and write: the waiter queue (a list of holders, oldest first)
-- KEYS[5]  fair and write: the waiters' places (sorted set: holder -> server ms it lives until)
-- KEYS[6]  write: the readers (sorted set: reader grant -> server ms its lease ends)
-- KEYS[#]  with a quarantine check (ARGV[5]): the run marker
-- ARGV[1]  the attempt id
-- ARGV[2]  the lease, in ms
-- ARGV[3]  '1' for a fencing token
-- ARGV[4]  the latest server time (ms) at which the request may act, or '': the time it was sent
--          plus its lease. Later, its client has given up and its undo may have come first; it
--          does nothing
-- ARGV[5]  the quarantine check, or '' (see `quarantined` in the prelude)
-- ARGV[6]  '' to acquire; or a grant of this lock (its attempt) to extend to ARGV[2] from now and
--          give a token if ARGV[3] asks for one and it has none: a re-entry in the client that
--          needs a longer lease or a token than the grant has
-- ARGV[7]  'x' plain, 'f' fair, 'w' write
-- ARGV[8]  fair and write: the holder (who waits in the queue)
-- ARGV[9]  fair and write: ms to keep a place in the queue when refused, '0' not to join
--
-- Returns {1, token} granted or extended (token -1 without one); {0, retry} refused (ms until
-- what is in the way may end, -1 unknown), or for an extend: the grant is not held; {-2, left}
-- the server run is in quarantine; {-4} the request arrived too late to act.
local lock, fence, void = KEYS[1], KEYS[2], KEYS[3]
local attempt, lease, kind = ARGV[1], tonumber(ARGV[2]), ARGV[7]
if ARGV[4] ~= '' and now_ms() > tonumber(ARGV[4]) then
  return {-4}
end
local held, token = owner(lock)
if ARGV[6] ~= '' then
  if held ~= ARGV[6] then
    return {0, -1}
  end
  extend(lock, lease)
  if ARGV[3] == '1' and not token then
    token = new_token(fence)
    redis.call('SET', lock, held .. '~' .. token, 'KEEPTTL')
  end
  return {1, token or -1}
end
local left = quarantined(ARGV[5], KEYS[#KEYS])
if left then
  return {-2, left}
end
if redis.call('SISMEMBER', void, attempt) == 1 then
  return {0, held and redis.call('PTTL', lock) or -1}
end
if held == attempt then
  -- The same request, sent again: it holds the lock already.
  return {1, token or -1}
end
if held and redis.call('SISMEMBER', void, held) == 1 then
  -- A late copy of an attempt its client gave up on took the lock: nobody holds it.
  held = nil
end
local retry = held and redis.call('PTTL', lock)
if kind ~= 'x' then
  local queue, places, holder = KEYS[4], KEYS[5], ARGV[8]
  local now = now_ms()
  purge_queue(queue, places, now)
  if not retry and kind == 'w' then
    redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
    local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')[2]
    retry = first and tonumber(first) - now
  end
  local head = redis.call('LINDEX', queue, 0)
  if not retry and head and head ~= holder then
    retry = tonumber(redis.call('ZSCORE', places, head)) - now
  end
  if retry then
    local ms = tonumber(ARGV[9])
    if ms > 0 then
      if not redis.call('ZSCORE', places, holder) then
        redis.call('RPUSH', queue, holder)
      end
      redis.call('ZADD', places, now + ms, holder)
      extend(queue, ms)
      extend(places, ms)
    end
    return {0, retry}
  end
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', places, holder)
  end
elseif retry then
  return {0, retry}
end
token = ARGV[3] == '1' and new_token(fence) or nil
redis.call('SET', lock, token and (attempt .. '~' .. token) or attempt, 'PX', lease)
return {1, token or -1}
