-- release_record: arg(1) 'get' | 'put'; put: arg(2) expected version ('0': none stored),
-- arg(3) new version, arg(4) state, arg(5) routes_stopped ('1'/'0'), arg(6) the
-- record (base64 of its proto). The servicer checked the transition against the
-- record it read; this compare-and-set on the version makes that check hold.
-- Returns {outcome, version, state, routes_stopped, record} ({..., '0', '0', '0', ''}: none).
local k = key('release')
local function stored(outcome)
  local v = redis.call('HMGET', k, 'version', 'state', 'routes_stopped', 'record')
  return {outcome, v[1] or '0', v[2] or '0', v[3] or '0', v[4] or ''}
end
if arg(1) == 'get' then return stored(OC.APPLIED) end
local cur = redis.call('HGET', k, 'version') or '0'
if cur ~= arg(2) then return stored(OC.STALE_GENERATION) end
redis.call('HSET', k, 'version', arg(3), 'state', arg(4), 'routes_stopped', arg(5), 'record', arg(6))
return stored(OC.APPLIED)
