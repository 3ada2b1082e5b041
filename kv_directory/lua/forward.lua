-- begin / validated / publish / validated-then-publish: arg(1) transfer_id,
-- arg(2) target state, arg(3) expected generation ('' = unchecked; publish
-- passes it), arg(4) the caller's K/V digest ('' = none), arg(5) the chunk
-- layout digest (validated), arg(6) '1' = validate first (target PUBLISHED:
-- TRANSFERRING -> VALIDATED -> PUBLISHED in this one script; the first answer
-- other than APPLIED/DUPLICATE is the reply), '2' = declare, then validate first
-- (the caller checked the source's seal over arg(4): a begin with it goes first,
-- RESERVED -> TRANSFERRING -> VALIDATED -> PUBLISHED in this one script).
-- Returns {outcome, txn flat or {}}.
-- Rule order: store.TransferLedger.begin.
local now = now_ms()
sweep(now)

local function forward(tid, target, gen, digest, chunks)
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
    -- Reserved under a route epoch a rollback retired: it may not move on (docs/design.md, The release).
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
end

local tid, target = arg(1), tonumber(arg(2))
if arg(6) == '1' or arg(6) == '2' then
  local state = tonumber(redis.call('HGET', key('txn', tid), 'state') or '-1')
  if state ~= ST.VALIDATED and state ~= ST.PUBLISHED and state ~= ST.RELEASED then
    if arg(6) == '2' then
      local declared = forward(tid, ST.TRANSFERRING, '', arg(4), '')
      if declared[1] ~= OC.APPLIED and declared[1] ~= OC.DUPLICATE then return declared end
    end
    local first = forward(tid, ST.VALIDATED, '', arg(4), arg(5))
    if first[1] ~= OC.APPLIED and first[1] ~= OC.DUPLICATE then return first end
  end
end
return forward(tid, target, arg(3), arg(4), arg(5))
