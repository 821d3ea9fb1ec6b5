-- Gives back a shared grant (a reader, a permit; see share.lua) and tells the waiters, or undoes
-- an attempt at one.
--
-- KEYS[1]  the grants (sorted set)
-- KEYS[2]  attempts given up on (a set)
-- ARGV[1]  the grant (its attempt)
-- ARGV[2]  the release channel
-- ARGV[3]  '' for a release; for an undo, how long (ms) to remember the attempt as given up on
--          (whether or not it held a grant: a copy still on its way then takes nothing)
--
-- Returns -1 when the grant is not held (nothing changed but an undo's record of the attempt),
-- n >= 0 when it was given back (n subscribers were told), as release.lua does.
if ARGV[3] == '' and redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  return publish(ARGV[2], 'released')
end
-- @helpers
if ARGV[3] ~= '' then
  give_up(KEYS[2], ARGV[1], ARGV[3])
  if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
    return publish(ARGV[2], 'released')
  end
end
return -1
