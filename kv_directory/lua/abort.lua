-- abort: arg(1) transfer_id, arg(2) reason. Returns {outcome, txn flat or {}}.
local now = now_ms()
sweep(now)
local tid = arg(1)
local m = txn_get(tid)
if not m then return {OC.NOT_FOUND, {}} end
local state = tonumber(m.state)
if state == ST.ABORTED then return txn_reply(OC.DUPLICATE, tid) end
if not LEGAL[ST.ABORTED][state] then return txn_reply(OC.ILLEGAL_TRANSITION, tid) end
txn_abort(tid, m, arg(2), now)
return txn_reply(OC.APPLIED, tid)
