-- consume_nonce: arg(1) nonce, arg(2) ttl ms, arg(3) route epoch the capability was
-- minted under (0: not checked), arg(4) attempt: the caller's token for this one call
-- ('' none; the value kept), so that the same call run again (redis-py's retry after a
-- reply lost to a timeout) answers APPLIED, not DUPLICATE. Returns outcome;
-- STALE_GENERATION when the epoch moved on.
local now = now_ms()
sweep(now)
local epoch = tonumber(arg(3)) or 0
if epoch > 0 and epoch ~= route_epoch_at(now) then return OC.STALE_GENERATION end
-- SET NX is the consume-once: only the first caller within the ttl creates it.
local attempt = arg(4) or ''
if redis.call('SET', key('nonce', arg(1)), attempt, 'NX', 'PX', arg(2)) then return OC.APPLIED end
if attempt ~= '' and redis.call('GET', key('nonce', arg(1))) == attempt then return OC.APPLIED end
return OC.DUPLICATE
