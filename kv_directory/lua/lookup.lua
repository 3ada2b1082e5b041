-- lookup: arg(1) transfer_id. Returns the txn flat ({} if absent).
sweep(now_ms())
return redis.call('HGETALL', key('txn', arg(1)))
