-- heartbeat: arg(1) worker_id, arg(2) epoch, arg(3..) load fields.
-- Returns {outcome, lease_expiry_ms, routes_stopped ('1'/'0')}; LEASE_LOST if not
-- live at that epoch.
local now = now_ms()
sweep(now)
local wid = arg(1)
local stopped = redis.call('HGET', key('release'), 'routes_stopped') or '0'
if not is_live(wid, arg(2), now) then return {OC.LEASE_LOST, 0, stopped} end
local exp = now + LEASE_MS
local wk = key('w', wid)
redis.call('HSET', wk, 'lease_expiry_ms', exp, 'load_reported_ms', now)
set_load(wk, 3)
redis.call('ZADD', key('leases'), exp, wid)
return {OC.APPLIED, exp, stopped}
