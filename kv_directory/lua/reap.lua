-- reap_expired: no args. Returns how many workers/transactions were reaped by
-- this bounded sweep (the caller repeats while it returns SWEEP_LIMIT or more).
return sweep(now_ms())
