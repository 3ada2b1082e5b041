-- seal_key: arg(1) worker_id, arg(2) epoch. Returns the seal key (hex) the worker
-- registered, '' when it registered none or arg(2) is not its current epoch (a
-- restarted worker's unpublished transactions were aborted with its old epoch).
local got = redis.call('HMGET', key('w', arg(1)), 'epoch', 'seal_key')
if got[1] and tonumber(got[1]) == tonumber(arg(2)) then return got[2] or '' end
return ''
