-- Reads what a lock holds, or with a channel in ARGV[2] clears it (a forced unlock) and answers
-- what it held just before. Expired shared grants and dropped places are not reported.
--
-- ARGV[1]  the layout and its KEYS:
--          'x' plain or fair: the owner record, the waiter queue, the waiters' places;
--          'rw' read-write: the write side's owner record, the readers, the queue, the places;
--          's' semaphore: the grants
-- ARGV[2]  '' to read; the release channel to clear the lock: the owner record and the shared
--          grants go (the queue stays), and the waiters are told (a fair queue's head by name)
--
-- Returns {owner record or '', its ms left, waiters queued, grant, ms left, grant, ms left, ...}.
local layout, now = ARGV[1], now_ms()
local lock, grants, queue, places
if layout == 's' then
  grants = KEYS[1]
else
  lock, queue, places = KEYS[1], KEYS[#KEYS - 1], KEYS[#KEYS]
  grants = layout == 'rw' and KEYS[2]
end
local reply = {'', -1, 0}
if lock then
  local held, token = owner(lock)
  if held then
    reply[1] = token and (held .. '~' .. token) or held
    reply[2] = redis.call('PTTL', lock)
  end
  reply[3] = redis.call('ZCOUNT', places, '(' .. now, '+inf')
end
if grants then
  local found = redis.pcall('ZRANGEBYSCORE', grants, '(' .. now, '+inf', 'WITHSCORES')
  if found.err then
    return error({err = 'WRONGTYPE ' .. grants .. ' holds a ' .. redis.call('TYPE', grants).ok
      .. ', not tower-lock shared grants'})
  end
  for i = 1, #found, 2 do
    reply[#reply + 1] = found[i]
    reply[#reply + 1] = tonumber(found[i + 1]) - now
  end
end
if ARGV[2] ~= '' and (reply[1] ~= '' or #reply > 3) then
  if lock then
    redis.call('DEL', lock)
  end
  if grants then
    redis.call('DEL', grants)
  end
  local message = 'released'
  if layout == 'x' then
    purge_queue(queue, places, now)
    message = redis.call('LINDEX', queue, 0) or message
  end
  publish(ARGV[2], message)
end
return reply
