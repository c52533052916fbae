"""The one Lua function that marks a worker dead, shared by the scripts that find a lease run out: the
expiry sweep (services/coordinator/worker_registry.py) and the heartbeat script (heartbeat_batch.py).

A dead worker leaves the live set (`leases`) and its credential's live identities (what the worker cap of
services/coordinator/credential_budget.py counts), and enters `dead`, scored by when its lease ran out:
pruning and the listings of dead workers read that, so thousands of dead identities cost no pass over the
live ones. Prepend it to a script; it reads keys by name (one Redis, not a cluster).
"""

from __future__ import annotations

# mark_dead(worker hash key, leases key, dead key, credential key prefix, worker id, when its lease ran out)
MARK_DEAD_LUA = """
local function mark_dead(worker_key, leases, dead, credential_prefix, worker_id, died_at_s)
  redis.call('ZREM', leases, worker_id)
  if redis.call('EXISTS', worker_key) == 1 then
    redis.call('HSET', worker_key, 'state', 'dead')
    redis.call('ZADD', dead, died_at_s, worker_id)
    local credential = redis.call('HGET', worker_key, 'operator_id') or ''
    redis.call('SREM', credential_prefix .. credential .. ':live', worker_id)
  end
end
"""
