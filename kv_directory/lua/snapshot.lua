-- snapshot: no args. Returns {route_epoch, now_ms, {release version, state,
-- routes_stopped}, {worker hash flat}, ...}.
local now = now_ms()
sweep(now)
local rel = redis.call('HMGET', key('release'), 'version', 'state', 'routes_stopped')
local out = {route_epoch_at(now), now, {rel[1] or '0', rel[2] or '0', rel[3] or '0'}}
-- '(' makes the bound exclusive: a lease expiring exactly now is dead.
for _, wid in ipairs(redis.call('ZRANGEBYSCORE', key('leases'), '(' .. now, '+inf')) do
  local w = redis.call('HGETALL', key('w', wid))
  if #w > 0 then table.insert(out, w) end
end
return out
