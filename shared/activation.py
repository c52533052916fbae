"""Cost-aware activation: which workers generate (active) and which wait on standby. Pure; used by the
coordinator's planner and by the simulator, so both make the same decisions from the same inputs.

    rank         price per unit of throughput, $/h per sample/s (cheapest first; ties: faster first)
    free         workers with price 0 are always active when `activate_free_workers` (they cost nothing)
    keep         the current active set, while it covers target * (1 - hysteresis)
    grow         add the cheapest standby workers until the active set covers target = required * (1 + margin)
    shrink       drop the most expensive active workers while the rest still cover target * (1 + hysteresis)
    re-pick      switch to the from-scratch greedy set only when it costs less than (1 - hysteresis) of
                 the kept one (a cheaper worker joined); never for a few cents
    dwell        a worker that changed state less than `min_dwell_s` ago keeps it (unless it must grow)

A measured throughput is the worker's own claim (its heartbeats): it counts at most MAX_RATIO_TO_MEDIAN
(4) x the low median of the measured fleet (shared/capacity.py `capped_at_median`), so one worker
claiming a huge rate cannot cover the target alone and put honest workers on standby.

Throughput of a worker that was never measured (it has not generated yet, e.g. it joined on standby):
the median measured throughput of active-or-measured workers with the same gpu_type, else of all
measured workers, else `assumed_samples_per_s`. Its first heartbeats while active replace the estimate.

Unknown requirement (the learner has not reported a step time yet): every worker is active, so the
first measurements come in; the planner switches to the cost-aware set once T_train is known.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from shared.capacity import capped_at_median


@dataclass(frozen=True)
class ActivationPolicy:
    """Knobs of the planner (shared.config.ActivationConfig holds the same, validated)."""

    margin: float = 0.2  # provision (1 + margin) * required
    hysteresis: float = 0.15  # relative band around the target where the active set is left alone
    min_dwell_s: float = 10.0  # a worker keeps a state at least this long unless capacity is short
    assumed_samples_per_s: float = 10.0  # throughput of a never-measured worker with no measured peers
    activate_free_workers: bool = True  # price 0: always active


@dataclass(frozen=True)
class Candidate:
    """One live worker as the planner sees it (dead and draining workers are not candidates)."""

    worker_id: str
    price_per_hour: float
    samples_per_s: float  # measured; 0.0 when never measured
    gpu_type: str = "cpu"
    active: bool = False  # currently active
    state_since_s: float = 0.0  # unix time of its last state change

    @property
    def measured(self) -> bool:
        return self.samples_per_s > 0


@dataclass(frozen=True)
class ActivationPlan:
    active_ids: frozenset[str]
    standby_ids: frozenset[str]
    target_samples_per_s: float  # required * (1 + margin); inf when the requirement is unknown
    planned_samples_per_s: float  # estimated throughput of the active set
    planned_price_per_hour: float  # workers only
    estimates: dict[str, float]  # worker id -> throughput used (measured or estimated)
    reason: str  # what the planner did, for logs and the dashboard

    def changes(self, current_active: set[str]) -> tuple[set[str], set[str]]:
        """(to activate, to put on standby) relative to `current_active`."""
        return set(self.active_ids) - current_active, (current_active & set(self.standby_ids))


def estimate_throughputs(candidates: list[Candidate], assumed_samples_per_s: float) -> dict[str, float]:
    """Measured throughput (capped at MAX_RATIO_TO_MEDIAN x the measured fleet's low median), or the median
    of measured peers of the same gpu_type, of all, or the assumption."""
    measured = [c for c in candidates if c.measured]
    rates = capped_at_median({c.worker_id: c.samples_per_s for c in measured})
    by_gpu: dict[str, list[float]] = {}
    for c in measured:
        by_gpu.setdefault(c.gpu_type, []).append(rates[c.worker_id])
    fleet_median = statistics.median(rates.values()) if measured else assumed_samples_per_s
    gpu_medians = {gpu: statistics.median(values) for gpu, values in by_gpu.items()}
    return {
        c.worker_id: rates[c.worker_id] if c.measured else gpu_medians.get(c.gpu_type, fleet_median) for c in candidates
    }


def plan_activation(
    candidates: list[Candidate], required_samples_per_s: float | None, policy: ActivationPolicy, now_s: float
) -> ActivationPlan:
    """Decide the active set. `required_samples_per_s` None (or not finite): activate everyone."""
    estimates = estimate_throughputs(candidates, policy.assumed_samples_per_s)
    by_id = {c.worker_id: c for c in candidates}
    if required_samples_per_s is None or not math.isfinite(required_samples_per_s):
        return _plan(by_id, set(by_id), estimates, math.inf, "requirement unknown: all workers active")

    target = required_samples_per_s * (1 + policy.margin)
    ranked = sorted(
        candidates, key=lambda c: (_price_per_throughput(c, estimates), -estimates[c.worker_id], c.worker_id)
    )
    free = {c.worker_id for c in candidates if policy.activate_free_workers and c.price_per_hour == 0}

    def supply(ids: set[str]) -> float:
        return sum(estimates[i] for i in ids)

    def cost(ids: set[str]) -> float:
        return sum(by_id[i].price_per_hour for i in ids)

    def settled(c: Candidate) -> bool:
        return now_s - c.state_since_s >= policy.min_dwell_s

    # keep the current set while it is inside the band, else grow it to the target (running sums: O(N))
    active = {c.worker_id for c in candidates if c.active} | free
    total = supply(active)
    reason = "kept: active set within the hysteresis band"
    if total < target * (1 - policy.hysteresis):
        total = _add_cheapest_until(active, total, target, ranked, estimates)
        reason = "grew: throughput below target"
    else:
        for c in reversed(ranked):  # most expensive per throughput first
            if c.worker_id not in active or c.worker_id in free or not settled(c):
                continue
            if total - estimates[c.worker_id] >= target * (1 + policy.hysteresis):
                active.discard(c.worker_id)
                total -= estimates[c.worker_id]
                reason = "shrank: more throughput than the target needs"

    # re-pick from scratch when that is clearly cheaper (e.g. a cheap worker joined); workers activated
    # less than min_dwell_s ago stay in either way
    greedy = set(free) | {c.worker_id for c in candidates if c.worker_id in active and not settled(c)}
    greedy_total = _add_cheapest_until(greedy, supply(greedy), target, ranked, estimates)
    if greedy_total >= target and cost(greedy) < cost(active) * (1 - policy.hysteresis):
        active, reason = greedy, "re-picked: the cheapest covering set costs clearly less"
    return _plan(by_id, active, estimates, target, reason)


def _add_cheapest_until(
    chosen: set[str], total: float, target: float, ranked: list[Candidate], estimates: dict[str, float]
) -> float:
    """Add workers to `chosen` in `ranked` order (cheapest per throughput first) until their summed
    throughput `total` reaches `target`; returns the new total."""
    for c in ranked:
        if total >= target:
            break
        if c.worker_id not in chosen:
            chosen.add(c.worker_id)
            total += estimates[c.worker_id]
    return total


def _price_per_throughput(c: Candidate, estimates: dict[str, float]) -> float:
    mu = estimates[c.worker_id]
    if c.price_per_hour == 0:
        return 0.0
    return c.price_per_hour / mu if mu > 0 else math.inf


def _plan(
    by_id: dict[str, Candidate], active: set[str], estimates: dict[str, float], target: float, reason: str
) -> ActivationPlan:
    return ActivationPlan(
        active_ids=frozenset(active),
        standby_ids=frozenset(set(by_id) - active),
        target_samples_per_s=target,
        planned_samples_per_s=sum(estimates[i] for i in active),
        planned_price_per_hour=sum(by_id[i].price_per_hour for i in active),
        estimates=estimates,
        reason=reason,
    )
