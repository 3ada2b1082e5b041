-- prefix_publish: arg(1) tenant, arg(2) worker_id, arg(3) epoch, arg(4) n evicted,
-- arg(5 .. 4+n) evicted hex hashes, then the held hex hashes. Evictions apply
-- first, so a hash both evicted and held (recomputed since) stays indexed.
local now = now_ms()
sweep(now)
local tenant, wid, epoch = arg(1), arg(2), arg(3)
if not is_live(wid, epoch, now) then return OC.LEASE_LOST end
local member = tonumber(epoch) .. ':' .. wid
local n_evicted = tonumber(arg(4))
for i = 5, 4 + n_evicted do redis.call('ZREM', tkey('pfx', tenant, arg(i)), member) end
local exp = now + PREFIX_TTL_MS
for i = 5 + n_evicted, argn() do
  local k = tkey('pfx', tenant, arg(i))
  redis.call('ZADD', k, exp, member)
  redis.call('PEXPIRE', k, PREFIX_TTL_MS)  -- the newest entry is the last to expire
end
return OC.APPLIED
