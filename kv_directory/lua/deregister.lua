-- deregister_worker: arg(1) worker_id, arg(2) epoch. Returns outcome.
local now = now_ms()
sweep(now)
local wid = arg(1)
if not is_live(wid, arg(2), now) then return OC.LEASE_LOST end
drop_worker(wid, 'worker_deregistered', now)
return OC.APPLIED
