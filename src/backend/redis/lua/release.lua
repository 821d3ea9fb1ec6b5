-- Deletes the owner record of a plain, fair or write lock if it names the grant, and tells the
-- waiters; or hands the lock to a local waiter in the same step; or undoes an attempt.
--
-- KEYS[1]  the owner record (see acquire.lua)
-- ARGV[1]  the grant: its attempt, or its whole record ('<attempt>~<token>')
-- The common call, a release, sends those two alone. The others add:
-- KEYS[2]  attempts given up on (a set)
-- KEYS[3]  the fencing record
-- KEYS[4]  fair: the waiter queue, KEYS[5] the waiters' places: the head alone is woken
-- ARGV[2]  'r' a release; 'u' an undo: ARGV[3] is how long (ms) to remember the attempt as given
--          up on (whether or not it held the record: a copy still on its way then takes
--          nothing); 'h' a release that hands the lock to another attempt
--          (a waiter in this client), ARGV[3], with lease ARGV[4] (ms) and a token if ARGV[5]
--          is '1'
--
-- Returns -1 when the record does not name the grant (nothing changed but an undo's record of
-- the attempt), n >= 0 when the lock was freed (n subscribers were told: a number, not a table,
-- which would cost the common call a third of its time), {3, token} when it was handed off
-- (token -1 without one).
local lock = KEYS[1]
local value = redis.call('GET', lock)
if value == ARGV[1] and not ARGV[2] then
  redis.call('DEL', lock)
  return publish(lock .. ':released', 'released')
end
-- @helpers
if ARGV[2] == 'u' then
  give_up(KEYS[2], ARGV[1], ARGV[3])
end
local held = owner(lock)
if held ~= ARGV[1] and value ~= ARGV[1] then
  return -1
end
if ARGV[2] == 'h' and redis.call('SISMEMBER', KEYS[2], ARGV[3]) == 0 then
  local token = ARGV[5] == '1' and new_token(KEYS[3]) or nil
  redis.call('SET', lock, token and (ARGV[3] .. '~' .. token) or ARGV[3], 'PX', ARGV[4])
  return {3, token or -1}
end
redis.call('DEL', lock)
local message = 'released'
if KEYS[5] then
  purge_queue(KEYS[4], KEYS[5], now_ms())
  message = redis.call('LINDEX', KEYS[4], 0) or message
end
return publish(lock .. ':released', message)
