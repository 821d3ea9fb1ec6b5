-- Acquires a reentrant lock for a holder.
--
-- A lock has two forms. A single hold granted by `SET NX PXAT` (the client's first try at a free
-- lock, see `SingleSet` in the backend) is a string: `<length of holder>:<holder><attempt>`,
-- then a newline and the client lease when the hold lives on one (see KEYS[4]). Its expiry is
-- absolute: the server's time when the client sent it (at most) plus the lease, so a `SET`
-- delivered late ends when one delivered on time would have, and never outlives the record of
-- its attempt that the attempt's undo keeps in KEYS[3] until then (abandon.lua).
-- Everything else is a hash, and this script turns a single hold into one when the holder
-- re-enters or another acquire is refused. A single hold whose attempt was given up on (its
-- `SET` arrived after the caller had given up) is nobody's: the next acquire takes it.
--
-- KEYS[1]  the lock: a single hold, or a hash: field <holder> = hold count, '~a' = the attempt
--          that granted the hold ('' once that attempt was undone while other holds remain:
--          every lock hash has '~a'), '~r' = the last re-entry's attempt, '~f' = token, '~s' =
--          the client lease the holds live on, if any
-- KEYS[2]  the fencing record (the last token issued; lives 5 s after a grant)
-- KEYS[3]  attempts given up on (set), so one that arrives late is refused
-- KEYS[4]  optional: the client lease the hold is to live on (a key whose expiry the client's
--          watchdog renews for all its holds at once); the lock then records it ('~s', or
--          after a newline in a single hold), and nobody holds the lock once it is gone
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds (with a client lease: how long the lock's key lives unless
--          refreshed, a multiple of the client lease)
-- ARGV[3]  attempt id (lets a caller whose reply was lost undo this attempt)
-- ARGV[4]  '1' to issue a fencing token
-- ARGV[5]  an earlier attempt of this acquisition whose reply was lost, or ''
-- ARGV[6]  re-entry: 'held' to re-enter only (grant nothing unless the holder already holds
--          the lock), 'free' to take only a new hold (a hold the holder still has counts as
--          another owner's), '' for either
-- ARGV[7]  the server's boot check, or '' (see `boot_unverified`)
-- ARGV[8]  with KEYS[4]: the client lease's length in milliseconds; a grant extends it ('')
-- ARGV[9]  the latest server time (ms) at which this request may still act, or '': the time
--          it was sent (a lower bound of the server's clock then) plus the lease. A request
--          delivered later than that (held back on its connection, or queued on a server that
--          stalled, while its caller gave up and its undo could not get through) would grant
--          a hold that nobody holds; it does nothing and answers {-4}
--
-- Returns {1, count, token} when the holder now holds the lock (token -1 without fencing;
-- {1, count, token, 0} when a grant meant for the client lease re-entered a hold that has a
-- lease of its own, and stays there),
-- {0, pttl} when another holder has it (pttl -1 when the key has no expiry), {-2, left} when the
-- server started less than a quarantine ago (left: milliseconds to go), {-3} when the
-- client lease in KEYS[4] has run out (nothing was granted: the client starts a new one), or
-- {-4} when the request arrived too late to act (ARGV[9]).
local lock = KEYS[1]
local holder = ARGV[1]
local lease = KEYS[4]
-- The common case first, before the helpers are defined: a free lock, and no attempt given up
-- on (no set of them), granted in four commands. (prelude.lua's `arrived_late`, inline.)
if ARGV[9] ~= '' then
  local time = redis.call('TIME')
  if tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) > tonumber(ARGV[9]) then
    return {-4}
  end
end
-- The boot check passes in one GET when the marker holds LASTSAVE; in full after the helpers.
local booted = ARGV[7] == ''
  or tonumber(redis.call('GET', string.match(ARGV[7], ':(.*)$'))) == redis.call('LASTSAVE')
-- A client lease that has run out is never brought back: its holds are over.
if booted and lease and redis.call('PEXPIRE', lease, ARGV[8]) == 0 then
  return {-3}
end
local free = booted and ARGV[6] ~= 'held' and redis.call('EXISTS', lock, KEYS[3]) == 0
if free then
  if lease then
    redis.call('HSET', lock, holder, 1, '~a', ARGV[3], '~s', lease)
  else
    redis.call('HSET', lock, holder, 1, '~a', ARGV[3])
  end
  redis.call('PEXPIRE', lock, ARGV[2])
  if ARGV[4] ~= '1' then
    return {1, 1, -1}
  end
end
-- @helpers
if not booted then
  local left = boot_unverified(ARGV[7])
  if left then
    return {-2, left}
  end
  if lease and redis.call('PEXPIRE', lease, ARGV[8]) == 0 then
    return {-3}
  end
end
if free then
  return {1, 1, fencing_token(lock, KEYS[2])}
end
if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 1 then
  return {0, redis.call('PTTL', lock)}
end
-- Holds that lived on a client lease that ran out are over: the lock is free.
local held_on = lock_lease(lock)
if lapsed(lock, held_on) then
  held_on = nil
end
if not as_hash(lock, KEYS[3]) then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if ARGV[6] ~= 'held' and redis.call('EXISTS', lock) == 0 then
  redis.call('HSET', lock, holder, 1, '~a', ARGV[3])
  if lease then
    redis.call('HSET', lock, '~s', lease)
  end
  return granted(lock, ARGV[2], 1, ARGV[4], KEYS[2])
end
local holds = redis.call('HEXISTS', lock, holder) == 1
-- A hold on a client lease that this grant does not renew (the holder's, taken through
-- another client) cannot be joined but by a re-entry of the client that has it ('held'): the
-- hold would end with a lease its client does not keep.
local foreign = held_on and held_on ~= lease and ARGV[6] ~= 'held'
if holds and not foreign and may_reenter(lock, ARGV[6], ARGV[5], '~a', '~r') then
  local count = reenter(lock, holder, ARGV[3], ARGV[5], '~a', '~r')
  if not lease or held_on == lease then
    return granted(lock, ARGV[2], count, ARGV[4], KEYS[2])
  end
  -- The holder's hold has a lease of its own (a hand-off, say): the re-entry joins it there,
  -- for the client lease's length, and says so.
  local reply = granted(lock, ARGV[8], count, ARGV[4], KEYS[2])
  table.insert(reply, 0)
  return reply
end
-- Refused: the lock is held (or, re-entering only, not held by this holder). It is a hash
-- now, whose release is always published (release.lua), so the caller may wait for that.
return {0, time_left(lock, held_on)}
