-- route epoch: arg(1) 'get' | 'advance', arg(2) expected ('' = unconditional).
-- Returns {outcome, route_epoch}.
sweep(now_ms())
local k = key('route_epoch')
local cur = tonumber(redis.call('GET', k) or '0')
if arg(1) == 'get' then return {OC.APPLIED, cur} end
if arg(2) ~= '' and tonumber(arg(2)) ~= cur then return {OC.STALE_GENERATION, cur} end
return {OC.APPLIED, redis.call('INCR', k)}
