-- list_open: arg(1) worker_id ('' = all). Returns {txn flat, ...}.
sweep(now_ms())
local tids
if arg(1) == '' then
  tids = redis.call('ZRANGE', key('open'), 0, -1)
else
  tids = redis.call('SMEMBERS', key('wtxn', arg(1)))
end
local out = {}
for _, tid in ipairs(tids) do
  local flat = redis.call('HGETALL', key('txn', tid))
  if #flat > 0 then table.insert(out, flat) end
end
return out
