-- reserve: arg(1..11) transfer_id, request_id, tenant, generation,
-- source_worker_id, source_epoch, dest_worker_id, dest_epoch, manifest_digest,
-- chunks_digest, route_epoch; arg(12) manifest_blob (opaque, stored
-- but not part of the identity); arg(13) attempt: the caller's token for this
-- one call ('' none), so that the same call run again (redis-py's retry after a
-- reply lost to a timeout) answers APPLIED, not DUPLICATE. Returns {outcome, txn flat or {}, the
-- request's current generation after the call}.
local now = now_ms()
sweep(now)
local FIELDS = {'transfer_id', 'request_id', 'tenant', 'generation', 'source_worker_id',
  'source_epoch', 'dest_worker_id', 'dest_epoch', 'manifest_digest', 'chunks_digest', 'route_epoch'}
local tid, rid, tenant, gen = arg(1), arg(2), arg(3), tonumber(arg(4))
local attempt = arg(13) or ''

local rk = tkey('req', tenant, rid)
local cur = tonumber(redis.call('HGET', rk, 'generation') or '0')
local function reply(outcome, with_txn)
  local flat = with_txn and redis.call('HGETALL', key('txn', tid)) or {}
  return {outcome, flat, cur}
end

local old = txn_get(tid)
if old then
  -- Idempotent only if the whole identity matches (docs/design.md, Contracts): the same
  -- transfer id with other bytes or other ends is corruption, not a retry.
  for i, f in ipairs(FIELDS) do
    if old[f] ~= arg(i) then return reply(OC.CHECKSUM_CONFLICT, true) end
  end
  if attempt ~= '' and old['attempt'] == attempt then return reply(OC.APPLIED, true) end
  return reply(OC.DUPLICATE, true)
end
if redis.call('HGET', key('release'), 'routes_stopped') == '1' then
  return reply(OC.ROUTES_STOPPED, false)
end
local route_epoch = tonumber(arg(11))
if route_epoch > 0 and route_epoch < route_epoch_at(now) then
  return reply(OC.STALE_GENERATION, false)
end
if not (is_live(arg(5), arg(6), now) and is_live(arg(7), arg(8), now)) then
  return reply(OC.LEASE_LOST, false)
end
if gen <= cur then return reply(OC.STALE_GENERATION, false) end

-- Checks done; writes start. A newer generation supersedes every older
-- unpublished attempt of the same request.
abort_set(tkey('reqtx', tenant, rid), 'superseded', now)
-- The register outlives every open txn of the request (deadline < expiry).
redis.call('HSET', rk, 'generation', gen)
redis.call('PEXPIRE', rk, TXN_TTL_MS + RETENTION_MS)
local k = key('txn', tid)
for i, f in ipairs(FIELDS) do redis.call('HSET', k, f, arg(i)) end
local deadline = now + TXN_TTL_MS
redis.call('HSET', k, 'state', ST.RESERVED, 'abort_reason', '', 'kv_digest', '', 'created_ms', now,
  'updated_ms', now, 'deadline_ms', deadline, 'manifest_blob', arg(12), 'attempt', attempt)
redis.call('ZADD', key('open'), deadline, tid)
redis.call('SADD', key('wtxn', arg(5)), tid)
redis.call('SADD', key('wtxn', arg(7)), tid)
redis.call('SADD', tkey('reqtx', tenant, rid), tid)
cur = gen
return reply(OC.APPLIED, true)
