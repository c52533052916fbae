"""The cost ledger: cumulative $ of the learner and of every worker, billed only while they run, and a
worker only for active time backed by verified work.

Layout of `RunKeys.cost_ledger` (one hash, values as strings):
    billed_until_s     unix time up to which everything is billed
    total_usd          learner_usd + every worker's
    learner_usd        the learner, billed while its status is starting/training
    worker:<id>        one worker, billed for its verified active time (below)
    workers_usd        the sum over workers (kept so a read needs no scan)
    pruned_workers_usd what workers cost that have since been pruned (services/coordinator/pruning.py):
                       their `worker:<id>` fields move here, so the totals above never shrink
    unverified_usd     what workers' active time would have cost that was not billed (below)
    pending:<id>       one worker's active time since its last verified group, $, not billed yet
    window:<id>        when that stretch started (unix s), and `verified:<id>` its scored groups then

**Verified work.** A worker's time is billed while it is ACTIVE or DRAINING (standby is not) and only
when work backs it: its cost accrues in `pending:<id>` and moves to `worker:<id>` at the first pass that
sees its count of scored groups (the reward service's, shared/worker_rewards.py: groups that passed every
check, not the groups it claims) grow. A stretch of `verified_work_window_s` with none is dropped to
`unverified_usd`, as is all time while the work accounting flags the worker (services/coordinator/work_flags.py:
it answers under half the fleet's median share of its leases). So a worker that leases and never answers,
or whose answers never score, costs nothing; an honest one is billed up to its latest scored group, and
an active worker starved of tasks for longer than the window is not billed for that wait.

Billing runs in one Lua script: it bills the seconds since `billed_until_s` (capped at
`max_billing_gap_s`, so a coordinator that was down does not invent hours of cost) at the rates
passed in, and moves `billed_until_s` forward. Two coordinators on one Redis therefore never bill
the same second twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import redis

from services.coordinator.measurements import BAD_MEASUREMENTS, MAX_USD, bounded_hash
from shared.keys import RunKeys

WORKER_FIELD_PREFIX = "worker:"
PRUNED_WORKERS_FIELD = "pruned_workers_usd"
UNVERIFIED_FIELD = "unverified_usd"
# a worker's open stretch of active time: cost not yet backed by a scored group, its start, the count then
PENDING_FIELD_PREFIXES = ("pending:", "window:", "verified:")
MAX_GROUP_COUNT = MAX_USD  # a stored count of scored groups past this is bad


class WorkerBill(NamedTuple):
    """What one priced, billable worker's time is billed from this pass."""

    price_per_hour: float
    num_groups_verified: int  # groups of it the reward service scored, ever
    flagged: bool  # flagged by the work accounting: its time is not billed


# KEYS: ledger. ARGV: now_s, max_gap_s, largest sane amount ($), learner $/h, verified-work window s,
# largest sane group count, then (worker id, $/h, groups verified, flagged '1'/'0') quadruples.
# Returns {billed seconds, number of bad stored values reset}. A stored value that is not a finite
# number within the bound (it would make HINCRBYFLOAT fail on every pass, or stop billing forever)
# restarts from 0 (the clock, and a worker's open stretch: from now).
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
local dt = 0  -- no time to bill (a second pass at the same time): workers' stretches are still settled
if now > last then
  dt = math.min(now - last, tonumber(ARGV[2]))
  redis.call('HSET', KEYS[1], 'billed_until_s', ARGV[1])
end
local learner = dt * tonumber(ARGV[4]) / 3600
add('learner_usd', learner)
local window, workers, unverified = tonumber(ARGV[5]), 0, 0
for i = 7, #ARGV, 4 do
  local id, verified = ARGV[i], tonumber(ARGV[i + 2])
  local usd = dt * tonumber(ARGV[i + 1]) / 3600
  local pending = sane(redis.call('HGET', KEYS[1], 'pending:' .. id), tonumber(ARGV[3]))
  local start = sane(redis.call('HGET', KEYS[1], 'window:' .. id), math.max(now, last))
  local mark = sane(redis.call('HGET', KEYS[1], 'verified:' .. id), tonumber(ARGV[6]))
  if not (pending and start and mark) then pending, start, mark = 0, math.min(now, last), verified end
  pending = pending + usd
  if ARGV[i + 3] == '1' then
    unverified, pending, start, mark = unverified + pending, 0, now, verified
  elseif verified > mark then
    add('worker:' .. id, pending)
    workers, pending, start, mark = workers + pending, 0, now, verified
  elseif now - start >= window then
    unverified, pending, start, mark = unverified + pending, 0, now, verified
  end
  redis.call('HSET', KEYS[1], 'pending:' .. id, tostring(pending), 'window:' .. id, tostring(start),
    'verified:' .. id, tostring(mark))
end
add('workers_usd', workers)
add('total_usd', learner + workers)
add('unverified_usd', unverified)
return {tostring(dt), bad}
"""


@dataclass(frozen=True)
class LedgerTotals:
    total_usd: float
    learner_usd: float
    workers_usd: float
    usd_by_worker: dict[str, float]
    billed_until_s: float
    unverified_usd: float = 0.0


class CostLedger:
    """`verified_work_window_s`: how long a worker's active time may wait for a scored group of it and still
    be billed (RunConfig.verified_work_window_s)."""

    def __init__(
        self, client: redis.Redis, keys: RunKeys, *, max_billing_gap_s: float, verified_work_window_s: float = 60.0
    ) -> None:
        self.redis = client
        self.key = keys.cost_ledger
        self.max_billing_gap_s = max_billing_gap_s
        self.verified_work_window_s = verified_work_window_s
        self._bill_script = client.register_script(_BILL_LUA)

    def bill(self, now_s: float, learner_price_per_hour: float, workers: Mapping[str, WorkerBill]) -> float:
        """Bill the time since the last call: the learner at its rate (0 when it is not running), each worker
        in `workers` (the priced ones in a billed state) by the verified-work rule (module docstring);
        returns the seconds billed (0 on the first call, which only starts the clock)."""
        quadruples = [
            item
            for worker_id, bill in workers.items()
            for item in (
                worker_id,
                repr(float(bill.price_per_hour)),
                str(int(bill.num_groups_verified)),
                "1" if bill.flagged else "0",
            )
        ]
        billed, num_bad = self._bill_script(
            keys=[self.key],
            args=[
                repr(now_s),
                repr(self.max_billing_gap_s),
                repr(MAX_USD),
                repr(float(learner_price_per_hour)),
                repr(float(self.verified_work_window_s)),
                repr(MAX_GROUP_COUNT),
                *quadruples,
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
            unverified_usd=raw.get(UNVERIFIED_FIELD, 0.0),
        )
