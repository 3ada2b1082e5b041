-- consume_nonce: arg(1) nonce, arg(2) ttl ms. Returns outcome.
sweep(now_ms())
-- SET NX is the consume-once: only the first caller within the ttl creates it.
if redis.call('SET', key('nonce', arg(1)), '1', 'NX', 'PX', arg(2)) then return OC.APPLIED end
return OC.DUPLICATE
