-- Extends many holders' leases in one call, each as renew.lua does: owner-checked, never
-- shortened. A key holding foreign data answers for itself and stops no other renewal.
--
-- KEYS[i]        a lock hash
-- ARGV[2i - 1]   its holder id
-- ARGV[2i]       its lease in milliseconds
--
-- Returns one reply per key: 1 when renewed, 0 when the holder no longer holds the lock, -1
-- when the key holds another type of value.
local replies = {}
for i, lock in ipairs(KEYS) do
  local held = redis.pcall('HEXISTS', lock, ARGV[2 * i - 1])
  if type(held) == 'table' then
    replies[i] = -1
  elseif held == 1 then
    extend(lock, ARGV[2 * i])
    replies[i] = 1
  else
    replies[i] = 0
  end
end
return replies
