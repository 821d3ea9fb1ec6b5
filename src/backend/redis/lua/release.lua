-- Releases one hold (or all holds) of a holder, owner-checked; when the lock becomes free,
-- either grants it to a hand-off holder in the same step or publishes the release.
--
-- KEYS[1]  the lock: a single hold or a hash (see acquire.lua)
-- KEYS[2]  the fencing record (with a hand-off only)
-- KEYS[3]  attempts given up on (a hand-off to one of them is not made; with a hand-off only)
-- ARGV[1]  releasing holder id
-- ARGV[2]  release channel
-- ARGV[3]  '1' to release every hold of the holder, '0' for one
-- ARGV[4]  attempt id that must be the lock's last recorded one, or '' for any: a release
--          for one particular hold (a lost one, or a retry) never frees a newer hold
-- ARGV[5]  how a single hold of the releasing holder starts: its length, ':', the holder id
--          (see acquire.lua; passed in so that the common case builds no string)
-- ARGV[6]  hand-off holder id; absent for a release without a hand-off
-- ARGV[7]  hand-off lease in milliseconds
-- ARGV[8]  hand-off attempt id
-- ARGV[9]  '1' to issue a fencing token to the hand-off holder
--
-- The common call, one hold released without a hand-off, is sent in a compact form: KEYS[1]
-- and ARGV[5] alone, as ARGV[1], followed by the attempt (ARGV[4]) as in a single hold. The
-- holder id and the attempt are then read from it, the channel is KEYS[1] .. ':released' and
-- ARGV[3] is '0'. (Each argument costs the server a string; most releases are this call.)
--
-- A lock whose holds lived on a client lease that ran out (see acquire.lua) is nobody's: it is
-- deleted, and the release answers {0}.
--
-- Returns {0} when the holder does not hold the lock (nothing changed), {1, remaining} when
-- holds remain, {2, n} when the lock was freed and the release published (n: the subscribers
-- it reached), {3, token} when it was handed off (token -1 without fencing), or the bare
-- integer 2 for a single hold freed without a hand-off. A hash that becomes free is always
-- published: whether anyone waits is not recorded, so no undo can lose it. A single hold is
-- never published: nobody waits for one, since a refused acquire turns it into a hash.
local lock = KEYS[1]
local single = redis.pcall('GET', lock)
-- The most common call of all: the compact form naming a single hold's whole value (it has no
-- client lease, since ARGV[1] never carries one). Compared whole, without building strings.
if single == ARGV[1] and not ARGV[2] then
  redis.call('DEL', lock)
  return 2
end
local compact = not ARGV[2]
local owner, attempt = ARGV[5], ARGV[4]
if compact then
  local colon = string.find(ARGV[1], ':', 1, true)
  local ends = colon + tonumber(string.sub(ARGV[1], 1, colon - 1))
  owner, attempt = string.sub(ARGV[1], 1, ends), string.sub(ARGV[1], ends + 1)
end
-- The other common cases, before the helpers are defined: a single hold (nobody waits for
-- one: a refused acquire turns it into a hash), or one read of the hash, then the release.
if type(single) == 'string' then
  if string.find(single, owner, 1, true) ~= 1 then
    return {0}
  end
  -- A hold on a client lease ends with it (see acquire.lua): prelude.lua's single_lease and
  -- lapsed, which are defined only below.
  local rest = string.sub(single, #owner + 1)
  local at = string.find(rest, '\n', 1, true)
  if at then
    local lease = string.sub(rest, at + 1)
    rest = string.sub(rest, 1, at - 1)
    if redis.call('EXISTS', lease) == 0 then
      redis.call('DEL', lock)
      return {0}
    end
  end
  if attempt ~= '' and rest ~= attempt then
    return {0}
  end
  redis.call('DEL', lock)
  if not ARGV[6] then
    return 2
  end
elseif not single then
  return {0}
else
  local holder = ARGV[1]
  if compact then
    -- The holder id in the owner prefix.
    holder = string.sub(owner, string.find(owner, ':', 1, true) + 1)
  end
  local found = redis.call('HMGET', lock, holder, '~a', '~s')
  local count = tonumber(found[1])
  if found[3] and redis.call('EXISTS', found[3]) == 0 then
    -- The client lease the holds lived on ran out: nobody holds the lock. Whoever waits for
    -- it may take it now.
    redis.call('DEL', lock)
    publish(ARGV[2] or (lock .. ':released'), 'released')
    return {0}
  end
  if not count or (attempt ~= '' and found[2] ~= attempt) then
    return {0}
  end
  if count > 1 and ARGV[3] ~= '1' then
    return {1, redis.call('HINCRBY', lock, holder, -1)}
  end
  redis.call('DEL', lock)
end
if not ARGV[6] then
  return {2, publish(ARGV[2] or (lock .. ':released'), 'released')}
end
-- @helpers
if redis.call('SISMEMBER', KEYS[3], ARGV[8]) == 0 then
  redis.call('HSET', lock, ARGV[6], 1, '~a', ARGV[8])
  redis.call('PEXPIRE', lock, ARGV[7])
  local token = -1
  if ARGV[9] == '1' then
    token = fencing_token(lock, KEYS[2])
  end
  return {3, token}
end
return {2, publish(ARGV[2], 'released')}
