-- prefix_lookup: arg(1) tenant, arg(2..) hex hashes (chain order).
-- Returns {worker_id, leading_blocks, ...} for live workers with >= 1 block.
local now = now_ms()
sweep(now)
local tenant = arg(1)
local epochs = {}  -- worker_id -> live epoch or false (memoized per call)
local function live(wid)
  if epochs[wid] == nil then epochs[wid] = live_epoch(wid, now) or false end
  return epochs[wid]
end
local run, alive = {}, nil
for i = 2, argn() do
  local k = tkey('pfx', tenant, arg(i))
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  local holders = {}
  for _, member in ipairs(redis.call('ZRANGE', k, 0, -1)) do
    local sep = string.find(member, ':', 1, true)
    local epoch, wid = tonumber(string.sub(member, 1, sep - 1)), string.sub(member, sep + 1)
    if live(wid) == epoch then
      holders[wid] = true
    else
      redis.call('ZREM', k, member)  -- dead or stale epoch: never returned, so drop it
    end
  end
  if alive == nil then
    alive = holders
  else
    for wid in pairs(alive) do if not holders[wid] then alive[wid] = nil end end
  end
  if next(alive) == nil then break end
  for wid in pairs(alive) do run[wid] = i - 1 end
end
local out = {}
for wid, n in pairs(run) do table.insert(out, wid); table.insert(out, n) end
return out
