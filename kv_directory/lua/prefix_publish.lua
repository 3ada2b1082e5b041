-- prefix_publish: arg(1) tenant, arg(2) worker_id, arg(3) epoch, arg(4..) hex hashes.
local now = now_ms()
sweep(now)
local tenant, wid, epoch = arg(1), arg(2), arg(3)
if not is_live(wid, epoch, now) then return OC.LEASE_LOST end
local member = tonumber(epoch) .. ':' .. wid
local exp = now + PREFIX_TTL_MS
for i = 4, argn() do
  local k = tkey('pfx', tenant, arg(i))
  redis.call('ZADD', k, exp, member)
  redis.call('PEXPIRE', k, PREFIX_TTL_MS)  -- the newest entry is the last to expire
end
return OC.APPLIED
