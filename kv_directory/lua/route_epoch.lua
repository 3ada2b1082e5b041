-- route epoch: arg(1) 'get' | 'advance' | 'pubs', arg(2) expected ('' = unconditional;
-- pubs: the epoch whose publications to count). Returns {outcome, route_epoch,
-- publications}: of the epoch an advance retired, or of the one asked for.
local now = now_ms()
sweep(now)
local cur = route_epoch_at(now)
local function pubs(epoch) return tonumber(redis.call('HGET', key('pubs'), tostring(epoch)) or '0') end
if arg(1) == 'get' then return {OC.APPLIED, cur, 0} end
if arg(1) == 'pubs' then return {OC.APPLIED, cur, pubs(arg(2))} end
if arg(2) ~= '' and tonumber(arg(2)) ~= cur then return {OC.STALE_GENERATION, cur, 0} end
local nxt = next_fence(cur, now)
redis.call('SET', key('route_epoch'), nxt)
return {OC.APPLIED, nxt, pubs(cur)}
