-- Reads what a lock holds, changing nothing (see snapshot.lua, sent in front of this script).
--
-- KEYS     as snapshot.lua says for the layout
-- ARGV[1]  the layout: 'x' (exclusive or fair lock), 'rw' (read-write lock) or 'sem'
--          (semaphore)
--
-- Returns what snapshot.lua returns, or a WRONGTYPE error when the lock's key holds data that
-- is not a lock of that layout.
local found = snapshot(ARGV[1], now_ms())
if not found then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
return found
