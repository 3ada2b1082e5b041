-- register_worker: arg(1..5) worker_id, role, grpc_addr, data_addr, abi_digest;
-- arg(6..) load fields in LOAD_FIELDS order, then capacity fields in
-- CAPACITY_FIELDS order, then the cost profile as JSON (stored opaquely), then
-- the colocated-only reason ('' when the worker may exchange K/V), then the model
-- identity ('' when not declared), then the seal key as hex ('' when none).
-- Returns {epoch, lease_expiry_ms, load_reported_ms}.
local now = now_ms()
sweep(now)
local wid = arg(1)
-- A key that is never deleted, and a fence (next_fence): a restarted worker always
-- gets a strictly greater epoch, even after its record was reaped or Redis lost it.
local epoch = next_fence(tonumber(redis.call('GET', key('epoch', wid)) or '0'), now)
redis.call('SET', key('epoch', wid), epoch)
-- Everything the previous incarnation left unpublished is fenced by the new epoch,
-- and what it had published is gone with its memory.
abort_set(key('wtxn', wid), 'worker_restarted', now)
release_held(wid, 'worker_restarted', now)
local exp = now + LEASE_MS
local wk = key('w', wid)
redis.call('DEL', wk)
redis.call('HSET', wk, 'worker_id', wid, 'role', arg(2), 'grpc_addr', arg(3),
  'data_addr', arg(4), 'abi_digest', arg(5), 'epoch', epoch, 'lease_expiry_ms', exp,
  'load_reported_ms', now)
set_load(wk, 6)
for i, f in ipairs(CAPACITY_FIELDS) do redis.call('HSET', wk, f, tonumber(arg(5 + #LOAD_FIELDS + i))) end
redis.call('HSET', wk, 'profile', arg(6 + #LOAD_FIELDS + #CAPACITY_FIELDS) or '')
redis.call('HSET', wk, 'colocated_only_reason', arg(7 + #LOAD_FIELDS + #CAPACITY_FIELDS) or '')
redis.call('HSET', wk, 'model_identity', arg(8 + #LOAD_FIELDS + #CAPACITY_FIELDS) or '')
redis.call('HSET', wk, 'seal_key', arg(9 + #LOAD_FIELDS + #CAPACITY_FIELDS) or '')
redis.call('ZADD', key('leases'), exp, wid)
return {epoch, exp, now}
