"""Dead workers are forgotten after a retention period, so the registry does not grow with every worker
that ever joined (3,000 registrations once made /v1/status 1.3 MiB and 197 ms; issue 10, item 8).

A worker dead for `dead_worker_retention_s` (counted from its lease's expiry) loses, in one script per
worker: its record, its place in the set of ids (and in the leases, where a dead worker no longer is),
its latest weight swap and its measured download rate. What it contributed to run totals stays: its
cost moves from the ledger's `worker:<id>` field into `pruned_workers_usd` (services/coordinator/ledger.py),
so `total_usd` and `workers_usd` are unchanged. Until it is pruned a dead worker may rejoin as itself
(services/coordinator/join.py); after, it joins under a new id.

The control loop prunes once per pass, reading the due ones from the dead workers' sorted set (by when
their lease ran out: a page of the oldest, never a pass over every worker); the script checks again that
the worker is still dead, so a worker that rejoined in between is left alone.
"""

from __future__ import annotations

import logging

from services.coordinator.ledger import PENDING_FIELD_PREFIXES, PRUNED_WORKERS_FIELD, WORKER_FIELD_PREFIX
from services.coordinator.worker_registry import WorkerRegistry

log = logging.getLogger(__name__)

# KEYS: worker hash, leases, worker ids, broadcast last swap, broadcast throughput, cost ledger, dead.
# ARGV: worker id, the ledger field of its cost, the ledger field pruned costs move to, then the ledger fields
# of its open stretch of unverified time (dropped: dead that long, it was never verified). Returns 1 if pruned.
_PRUNE_LUA = """
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'dead' then
  redis.call('ZREM', KEYS[7], ARGV[1])  -- alive again: it is no longer dead
  return 0
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
local usd = redis.call('HGET', KEYS[6], ARGV[2])
if usd then
  redis.call('HINCRBYFLOAT', KEYS[6], ARGV[3], usd)
  redis.call('HDEL', KEYS[6], ARGV[2])
end
redis.call('HDEL', KEYS[6], unpack(ARGV, 4))
return 1
"""
MAX_PRUNED_PER_PASS = 1000  # a pass stays short even when thousands expire at once; the rest go next pass


class DeadWorkerPruner:
    def __init__(self, registry: WorkerRegistry, retention_s: float) -> None:
        self.registry = registry
        self.redis = registry.redis
        self.keys = registry.keys
        self.retention_s = retention_s
        self._script = self.redis.register_script(_PRUNE_LUA)
        self.num_pruned = 0

    def due(self, now_s: float) -> list[str]:
        """Ids of the dead workers whose lease ran out at least `retention_s` ago (MAX_PRUNED_PER_PASS at most)."""
        return self.registry.dead_due(now_s - self.retention_s, MAX_PRUNED_PER_PASS)

    def prune(self, now_s: float) -> set[str]:
        """Forget the workers `due` now; returns the ids pruned."""
        due = self.due(now_s)
        if not due:
            return set()
        k = self.keys
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in due:
                self._script(
                    keys=[
                        k.worker(worker_id),
                        k.worker_leases,
                        k.worker_ids,
                        k.broadcast_last_swap,
                        k.broadcast_throughput,
                        k.cost_ledger,
                        k.worker_dead,
                    ],
                    args=[
                        worker_id,
                        WORKER_FIELD_PREFIX + worker_id,
                        PRUNED_WORKERS_FIELD,
                        *(prefix + worker_id for prefix in PENDING_FIELD_PREFIXES),
                    ],
                    client=pipe,
                )
            results = pipe.execute()
        pruned = {worker_id for worker_id, done in zip(due, results, strict=True) if done}
        self.num_pruned += len(pruned)
        if pruned:
            log.info("pruned %d workers dead for more than %.0fs", len(pruned), self.retention_s)
        return pruned
