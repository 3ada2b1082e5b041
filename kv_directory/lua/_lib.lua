-- Shared prelude of every directory script. redis_store concatenates
--   <header generated from states.py/store.py> .. _lib.lua .. <op>.lua
-- into one script, so everything below is in scope for each operation.
--
-- Calling convention (redis_store._run): no KEYS; ARGV[1..5] are the store's
-- configuration, ARGV[6..] the operation's arguments, read with arg(i).
--
-- Safety invariant: an operation reads and validates everything before its
-- first write. Redis does not roll back a script that errors halfway, so a
-- check placed after a write could leave a half-applied transition.
--
-- Time: now_ms() is the Redis server clock (TIME). Leases, deadlines and
-- retention are all judged on this one clock, never on a caller's, so callers
-- with skewed clocks agree on who is live. Needs Redis >= 5 (effects
-- replication lets a script write after reading TIME).
--
-- Key layout (PREFIX defaults to "{pd}", one cluster slot):
--   leases            zset  worker_id -> lease expiry ms (membership = registered)
--   w:<wid>           hash  WorkerRecord fields + load fields
--   epoch:<wid>       int   last epoch issued; never deleted (epochs stay monotonic)
--   wtxn:<wid>        set   open transfer ids with this worker at either end
--   dpub:<wid>        set   PUBLISHED transfer ids whose K/V this (decode) worker holds
--   open              zset  open (unpublished) transfer id -> deadline ms
--   txn:<tid>         hash  Transaction fields; PEXPIREs once terminal
--   req:<n>:<tenant>:<rid>    hash  generation, published (the publish CAS register)
--   reqtx:<n>:<tenant>:<rid>  set   open transfer ids of the request
--   route_epoch       int
--   pubs              hash  route epoch -> transactions published under it (rollback checks)
--   release           hash  version, state, routes_stopped, record (base64 proto; release_record.lua)
--   nonce:<nonce>     string, PX = its ttl
--   ack_mark          string, written by redis_store after a WAITed script (never read)

local PREFIX = ARGV[1]
local LEASE_MS = tonumber(ARGV[2])
local TXN_TTL_MS = tonumber(ARGV[3])
local RETENTION_MS = tonumber(ARGV[4])
local function arg(i) return ARGV[4 + i] end
local function argn() return #ARGV - 4 end

-- Lazy reaping does at most this much per call; liveness checks below never
-- rely on the sweep being complete (they compare expiry with now themselves).
local SWEEP_LIMIT = 128

local function key(kind, id)
  if id == nil then return PREFIX .. ':' .. kind end
  return PREFIX .. ':' .. kind .. ':' .. id
end

-- Tenant-scoped key. The tenant's length keeps ('a:b','c') and ('a','b:c') apart.
local function tkey(kind, tenant, id)
  return PREFIX .. ':' .. kind .. ':' .. #tenant .. ':' .. tenant .. ':' .. id
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Fences (worker epochs, the route epoch) never move backwards, even when Redis
-- lost its data: a new fence is at least the clock in ms, and every fence was
-- issued at or before its own issue time, so it is smaller than any later `now`.
-- (Redis's clock stepping back across a data loss is the one way around this.)
local function next_fence(current, now)
  return math.max(current + 1, now)
end

-- The route epoch; a missing key (a new cluster, or Redis lost its data) starts at `now`.
local function route_epoch_at(now)
  local v = redis.call('GET', key('route_epoch'))
  if v then return tonumber(v) end
  redis.call('SET', key('route_epoch'), now)
  return now
end

-- Epoch of worker `wid` if its lease is unexpired at `now`, else nil.
local function live_epoch(wid, now)
  local exp = redis.call('ZSCORE', key('leases'), wid)
  if not exp or tonumber(exp) <= now then return nil end
  return tonumber(redis.call('HGET', key('w', wid), 'epoch'))
end

local function is_live(wid, epoch, now)
  return live_epoch(wid, now) == tonumber(epoch)
end

-- Transaction as a Lua table (field -> string), or nil.
local function txn_get(tid)
  local flat = redis.call('HGETALL', key('txn', tid))
  if #flat == 0 then return nil end
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end

local function txn_reply(outcome, tid)
  return {outcome, redis.call('HGETALL', key('txn', tid))}
end

local function is_unpublished(state) return tonumber(state) <= ST.VALIDATED end

-- Move `m` (transfer `tid`) to `state`. Leaving the unpublished states removes
-- it from every open index; a terminal record starts its retention clock.
local function txn_set(tid, m, state, reason, now)
  local k = key('txn', tid)
  if reason then
    redis.call('HSET', k, 'state', state, 'updated_ms', now, 'abort_reason', reason)
  else
    redis.call('HSET', k, 'state', state, 'updated_ms', now)
  end
  if state == ST.PUBLISHED then
    redis.call('SADD', key('dpub', m.dest_worker_id), tid)
  elseif tonumber(m.state) == ST.PUBLISHED then
    redis.call('SREM', key('dpub', m.dest_worker_id), tid)
  end
  if is_unpublished(m.state) and not is_unpublished(state) then
    redis.call('ZREM', key('open'), tid)
    redis.call('SREM', key('wtxn', m.source_worker_id), tid)
    redis.call('SREM', key('wtxn', m.dest_worker_id), tid)
    redis.call('SREM', tkey('reqtx', m.tenant, m.request_id), tid)
  end
  if state >= ST.RELEASED then redis.call('PEXPIRE', k, math.max(RETENTION_MS, 1)) end
  m.state = tostring(state)
end

local function txn_abort(tid, m, reason, now)
  txn_set(tid, m, ST.ABORTED, reason, now)
end

-- Abort every unpublished transaction in index set `setkey`; returns the count.
local function abort_set(setkey, reason, now)
  local n = 0
  for _, tid in ipairs(redis.call('SMEMBERS', setkey)) do
    local m = txn_get(tid)
    if m and is_unpublished(m.state) then
      txn_abort(tid, m, reason, now)
      n = n + 1
    else
      redis.call('SREM', setkey, tid)  -- index entry outlived its record
    end
  end
  return n
end

-- Release every PUBLISHED transaction whose K/V worker `wid` held: the worker is
-- gone (lease expired, deregistered, restarted), and its published K/V with it.
-- Returns the count.
local function release_held(wid, reason, now)
  local n = 0
  for _, tid in ipairs(redis.call('SMEMBERS', key('dpub', wid))) do
    local m = txn_get(tid)
    if m and tonumber(m.state) == ST.PUBLISHED then
      txn_set(tid, m, ST.RELEASED, 'decode worker gone: ' .. reason, now)
      n = n + 1
    else
      redis.call('SREM', key('dpub', wid), tid)  -- index entry outlived its record
    end
  end
  return n
end

local function drop_worker(wid, reason, now)
  redis.call('ZREM', key('leases'), wid)
  redis.call('DEL', key('w', wid))
  return 1 + abort_set(key('wtxn', wid), reason, now) + release_held(wid, reason, now)
end

-- Lazy reaping, run first by every operation: expired leases, then overdue
-- unpublished transactions. Returns how many things it reaped.
local function sweep(now)
  local n = 0
  local dead = redis.call('ZRANGEBYSCORE', key('leases'), '-inf', now, 'LIMIT', 0, SWEEP_LIMIT)
  for _, wid in ipairs(dead) do n = n + drop_worker(wid, 'lease_expired', now) end
  local overdue = redis.call('ZRANGEBYSCORE', key('open'), '-inf', now, 'LIMIT', 0, SWEEP_LIMIT)
  for _, tid in ipairs(overdue) do
    local m = txn_get(tid)
    if m and is_unpublished(m.state) then
      txn_abort(tid, m, 'txn_timeout', now)
      n = n + 1
    else
      redis.call('ZREM', key('open'), tid)
    end
  end
  return n
end

local function set_load(wk, first)
  for i, f in ipairs(LOAD_FIELDS) do redis.call('HSET', wk, f, tonumber(arg(first + i - 1))) end
end
