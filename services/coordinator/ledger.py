"""The cost ledger: cumulative $ of the learner and of every worker, billed only while they run.

Layout of `RunKeys.cost_ledger` (one hash, values as strings):
    billed_until_s     unix time up to which everything is billed
    total_usd          learner_usd + every worker's
    learner_usd        the learner, billed while its status is starting/training
    worker:<id>        one worker, billed while it is ACTIVE or DRAINING (standby is not billed)
    workers_usd        the sum over workers (kept so a read needs no scan)
    pruned_workers_usd what workers cost that have since been pruned (services/coordinator/pruning.py):
                       their `worker:<id>` fields move here, so the totals above never shrink

Billing runs in one Lua script: it bills the seconds since `billed_until_s` (capped at
`max_billing_gap_s`, so a coordinator that was down does not invent hours of cost) at the rates
passed in, and moves `billed_until_s` forward. Two coordinators on one Redis therefore never bill
the same second twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis

from services.coordinator.measurements import BAD_MEASUREMENTS, MAX_USD, bounded_hash
from shared.keys import RunKeys

WORKER_FIELD_PREFIX = "worker:"
PRUNED_WORKERS_FIELD = "pruned_workers_usd"

# KEYS: ledger. ARGV: now_s, max_gap_s, largest sane amount ($), learner $/h, then (worker id, $/h)
# pairs. Returns {billed seconds, number of bad stored values reset}. A stored value that is not a
# finite number within the bound (it would make HINCRBYFLOAT fail on every pass, or stop billing
# forever) restarts from 0 (the clock: from now).
_BILL_LUA = """
local bad = 0
local function sane(value, limit)
  local number = tonumber(value or '')
  if number and number == number and number >= 0 and number <= limit then return number end
  if value then bad = bad + 1 end
  return nil
end
local function add(field, usd)
  if not sane(redis.call('HGET', KEYS[1], field), tonumber(ARGV[3])) then redis.call('HSET', KEYS[1], field, '0') end
  redis.call('HINCRBYFLOAT', KEYS[1], field, usd)
end
local now = tonumber(ARGV[1])
local last = sane(redis.call('HGET', KEYS[1], 'billed_until_s'), now + tonumber(ARGV[2]))
if not last then
  redis.call('HSET', KEYS[1], 'billed_until_s', ARGV[1])
  return {'0', bad}
end
if now <= last then return {'0', bad} end
local dt = math.min(now - last, tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'billed_until_s', ARGV[1])
local learner = dt * tonumber(ARGV[4]) / 3600
add('learner_usd', learner)
local workers = 0
for i = 5, #ARGV, 2 do
  local usd = dt * tonumber(ARGV[i + 1]) / 3600
  add('worker:' .. ARGV[i], usd)
  workers = workers + usd
end
add('workers_usd', workers)
add('total_usd', learner + workers)
return {tostring(dt), bad}
"""


@dataclass(frozen=True)
class LedgerTotals:
    total_usd: float
    learner_usd: float
    workers_usd: float
    usd_by_worker: dict[str, float]
    billed_until_s: float


class CostLedger:
    def __init__(self, client: redis.Redis, keys: RunKeys, *, max_billing_gap_s: float) -> None:
        self.redis = client
        self.key = keys.cost_ledger
        self.max_billing_gap_s = max_billing_gap_s
        self._bill_script = client.register_script(_BILL_LUA)

    def bill(self, now_s: float, learner_price_per_hour: float, worker_prices_per_hour: Mapping[str, float]) -> float:
        """Bill the time since the last call at these rates (the learner's 0 when it is not running);
        returns the seconds billed (0 on the first call, which only starts the clock)."""
        pairs = [
            item for worker_id, price in worker_prices_per_hour.items() for item in (worker_id, repr(float(price)))
        ]
        billed, num_bad = self._bill_script(
            keys=[self.key],
            args=[
                repr(now_s),
                repr(self.max_billing_gap_s),
                repr(MAX_USD),
                repr(float(learner_price_per_hour)),
                *pairs,
            ],
        )
        for _ in range(int(num_bad)):
            BAD_MEASUREMENTS.count("ledger", "reset to 0")
        return float(billed)

    def totals(self) -> LedgerTotals:
        """The totals as stored; a bad stored value (services/coordinator/measurements.py) reads as 0."""
        raw = bounded_hash(self.redis.hgetall(self.key), "ledger", 0.0, MAX_USD)
        return LedgerTotals(
            total_usd=raw.get("total_usd", 0.0),
            learner_usd=raw.get("learner_usd", 0.0),
            workers_usd=raw.get("workers_usd", 0.0),
            usd_by_worker={
                k.removeprefix(WORKER_FIELD_PREFIX): v for k, v in raw.items() if k.startswith(WORKER_FIELD_PREFIX)
            },
            billed_until_s=raw.get("billed_until_s", 0.0),
        )
