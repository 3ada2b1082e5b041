-- route epoch: arg(1) 'get' | 'advance', arg(2) expected ('' = unconditional).
-- Returns {outcome, route_epoch}.
local now = now_ms()
sweep(now)
local cur = route_epoch_at(now)
if arg(1) == 'get' then return {OC.APPLIED, cur} end
if arg(2) ~= '' and tonumber(arg(2)) ~= cur then return {OC.STALE_GENERATION, cur} end
local nxt = next_fence(cur, now)
redis.call('SET', key('route_epoch'), nxt)
return {OC.APPLIED, nxt}
