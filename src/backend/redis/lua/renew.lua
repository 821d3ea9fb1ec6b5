-- Renews a batch of grants: each one still held lives at least its lease from now. A renewal
-- never creates a record, never shortens one, and never brings back a shared grant whose lease
-- ended; it names its grant, so it extends nothing a later grant of the same holder took.
--
-- KEYS[i]     the i-th grant's key: an owner record (see acquire.lua) or shared grants (see
--             share.lua)
-- ARGV[2i-1]  'o' followed by the grant's attempt for an owner record, 's' for a shared grant
-- ARGV[2i]    the lease, in ms
--
-- Returns one integer per grant: 1 renewed, 0 not held, -1 the key holds another type of data.
local replies, now = {}, nil
for i, key in ipairs(KEYS) do
  local named, ms = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local grant, reply = string.sub(named, 2), 0
  if string.byte(named) == 111 then
    local value = redis.pcall('GET', key)
    if type(value) == 'table' then
      reply = -1
    elseif value and (value == grant or string.sub(value, 1, #grant + 1) == grant .. '~') then
      extend(key, ms)
      reply = 1
    end
  else
    now = now or now_ms()
    local ends = redis.pcall('ZSCORE', key, grant)
    if type(ends) == 'table' then
      reply = -1
    elseif ends and tonumber(ends) > now then
      redis.call('ZADD', key, 'GT', now + ms, grant)
      extend(key, ms)
      reply = 1
    end
  end
  replies[i] = reply
end
return replies
