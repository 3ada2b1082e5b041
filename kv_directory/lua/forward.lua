-- begin / validated / publish: arg(1) transfer_id, arg(2) target state,
-- arg(3) expected generation ('' = unchecked; publish passes it), arg(4) the
-- caller's K/V digest ('' = none), arg(5) the chunk layout digest (validated).
-- Returns {outcome, txn flat or {}}. Rule order: store.TransferLedger.begin.
local now = now_ms()
sweep(now)
local tid, target, gen, digest, chunks = arg(1), tonumber(arg(2)), arg(3), arg(4), arg(5)
local m = txn_get(tid)
if not m then return {OC.NOT_FOUND, {}} end
local state = tonumber(m.state)
if gen ~= '' and tonumber(gen) ~= tonumber(m.generation) then
  return txn_reply(OC.STALE_GENERATION, tid)
end
if state == ST.ABORTED then
  return txn_reply(ABORT_OUTCOME[m.abort_reason] or OC.ILLEGAL_TRANSITION, tid)
end
local rk = tkey('req', m.tenant, m.request_id)
local cur = tonumber(redis.call('HGET', rk, 'generation') or '0')
if cur > tonumber(m.generation) then
  if is_unpublished(state) then txn_abort(tid, m, 'superseded', now) end
  return txn_reply(OC.STALE_GENERATION, tid)
end
local declared = m.kv_digest or ''
if digest ~= '' and declared ~= '' and digest ~= declared then
  return txn_reply(OC.CHECKSUM_CONFLICT, tid)
end
if target == ST.VALIDATED and chunks ~= m.chunks_digest then
  return txn_reply(OC.CHECKSUM_CONFLICT, tid)
end
if state == target or (target == ST.PUBLISHED and state == ST.RELEASED) then
  if target == ST.TRANSFERRING and digest ~= '' and declared == '' then
    -- The source declares its digest after the transfer began.
    redis.call('HSET', key('txn', tid), 'kv_digest', digest, 'updated_ms', now)
    return txn_reply(OC.APPLIED, tid)
  end
  return txn_reply(OC.DUPLICATE, tid)
end
if is_unpublished(state) then
  -- The sweep is bounded, so check this transaction's own deadline too.
  if tonumber(m.deadline_ms) <= now then
    txn_abort(tid, m, 'txn_timeout', now)
    return txn_reply(ABORT_OUTCOME['txn_timeout'], tid)
  end
  if not is_live(m.dest_worker_id, m.dest_epoch, now) then
    txn_abort(tid, m, 'dest_lease_lost', now)
    return txn_reply(OC.LEASE_LOST, tid)
  end
  -- Reserved under a route epoch a rollback retired: it may not move on (0x0FG).
  local re = tonumber(m.route_epoch) or 0
  if re > 0 and re < route_epoch_at(now) then
    txn_abort(tid, m, 'route_epoch_retired', now)
    return txn_reply(OC.STALE_GENERATION, tid)
  end
end
if not LEGAL[target][state] then return txn_reply(OC.ILLEGAL_TRANSITION, tid) end
if target ~= ST.TRANSFERRING and (declared == '' or digest ~= declared) then
  return txn_reply(OC.CHECKSUM_CONFLICT, tid)
end
txn_set(tid, m, target, nil, now)
if declared == '' and digest ~= '' then
  redis.call('HSET', key('txn', tid), 'kv_digest', digest)
end
if target == ST.PUBLISHED then
  -- The compare-and-set: generation == current was checked above, in this script.
  redis.call('HSET', rk, 'published', tid)
  redis.call('PEXPIRE', rk, TXN_TTL_MS + RETENTION_MS)
  redis.call('HINCRBY', key('pubs'), m.route_epoch, 1)
end
return txn_reply(OC.APPLIED, tid)
