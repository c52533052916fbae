"""Where the time goes, and which side bounds the run: the learner's wait for data against its training, the
workers' generation against the time the staleness gate held them or no task was there, the weight sync.

Producer: the coordinator (services/coordinator/run_view.py), from the learner's state, the workers'
heartbeats and the measured broadcasts, for /v1/status, /v1/dashboard and /metrics; the local runner copies
the final one into report.json and prints its verdict as the run's last line (docs/operations.md explains it).

The verdict, in the order it is decided (thresholds below):
- "too early": fewer than MIN_STEPS learner steps, or no worker time reported yet;
- "learner-bound": the learner waited for rollouts under WAIT_FRACTION_BOUND of its time: it is the
  bottleneck, more workers would not help (a faster learner, or fewer samples a step, would);
- "feed-bound" (asynchronous runs): the learner waited, and the workers waited for a task to lease
  FEED_FRACTION_BOUND or more of their time: the data plane keeps too few tasks in flight ([data]
  max_groups_in_flight; under dynamic sampling the feed already widens it by the share of flat groups), so
  more tasks in flight would help
  (a synchronous run's workers wait for its learner by design: never this verdict);
- "sync-bound": the learner waited, and either the workers spent GATED_FRACTION_BOUND or more of their time
  held by the staleness gate (their weights too old to be trained on) or, in a synchronous run (which
  waits for every version), T_bcast p95 is SYNC_TO_TRAIN_BOUND or more of a training step: weights reach the
  workers too late, so faster weight sync (more relay seeds, deltas) or a larger staleness bound would help.
  An asynchronous run's late weights cost it only what the gate holds (a batch-mode worker loads a version
  after its engine call: on a saturated core T_bcast is about one call, and that is no wait);
- "generation-bound": the learner waited and the weights were on time: rollouts come too slowly, so more
  (or faster) workers would help.
The workers' seconds are their own claims (heartbeats), summed over the workers listed: a diagnosis, never
billed or trusted for anything else.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["too early", "learner-bound", "feed-bound", "sync-bound", "generation-bound"]

MIN_STEPS = 3
WAIT_FRACTION_BOUND = 0.2  # the learner waited for data at least this share of its time: not learner-bound
GATED_FRACTION_BOUND = 0.2  # the workers were held by the gate at least this share of their time: sync-bound
FEED_FRACTION_BOUND = 0.2  # the workers waited for a task at least this share of their time: feed-bound
SYNC_TO_TRAIN_BOUND = 0.5  # T_bcast p95 over T_train at least this: sync-bound

VERDICT_ADVICE: dict[Verdict, str] = {
    "too early": "not enough steps to say",
    "learner-bound": "more workers would not help; a faster learner would",
    "feed-bound": "workers ran out of tasks: more in flight ([data] max_groups_in_flight) would help",
    "sync-bound": "weights reach the workers too late: faster weight sync or a larger S would help",
    "generation-bound": "more workers would help",
}


class WorkerTimeUse(BaseModel):
    """One worker's own account of its time since it registered (its heartbeat's counters)."""

    model_config = ConfigDict(frozen=True)

    generating_s: float = Field(0.0, ge=0, description="seconds its engine spent generating")
    gated_s: float = Field(0.0, ge=0, description="seconds the staleness gate held it (its weights too old)")
    waiting_for_tasks_s: float = Field(0.0, ge=0, description="seconds it waited because no task was there")


class TimeUse(BaseModel):
    """Where the run's time went so far, and the side that bounds it."""

    model_config = ConfigDict(extra="forbid")

    learner_wall_s: float = Field(description="the learner's run time")
    learner_train_s: float = Field(description="seconds in optimizer steps")
    learner_wait_s: float = Field(description="seconds the learner waited for admissible rollouts")
    learner_wait_fraction: float | None = Field(description="learner_wait_s / learner_wall_s")
    learner_train_s_mean: float | None = Field(description="T_train: mean seconds per step")
    workers_generating_s: float = Field(description="summed over the workers: generating")
    workers_gated_s: float = Field(description="summed over the workers: held by the staleness gate")
    workers_waiting_for_tasks_s: float = Field(description="summed over the workers: no task to lease")
    workers_gated_fraction: float | None = Field(description="gated / (generating + gated + waiting)")
    weight_sync_mean_s: float | None = Field(description="T_bcast mean over the measured versions")
    weight_sync_p95_s: float | None = Field(description="T_bcast p95 over the measured versions")
    swap_pause_mean_s: float | None = Field(description="the workers' rollout pause per weight swap, mean")
    stale_tokens_dropped: int = Field(description="completion tokens not trained because they were too old")
    verdict: Verdict
    verdict_line: str = Field(description="the verdict with the numbers behind it, one line")


def time_use(
    *,
    learner_wall_s: float,
    learner_train_s: float,
    learner_wait_s: float,
    num_steps: int,
    workers: Iterable[WorkerTimeUse],
    weight_sync_s: Iterable[float],
    swap_pause_mean_s: float | None,
    stale_tokens_dropped: int,
    synchronous: bool = False,
) -> TimeUse:
    """`synchronous`: a pull-mode run (its workers wait for the learner by design: never feed-bound)."""
    listed = list(workers)
    generating_s = sum(w.generating_s for w in listed)
    gated_s = sum(w.gated_s for w in listed)
    waiting_s = sum(w.waiting_for_tasks_s for w in listed)
    worker_s = generating_s + gated_s + waiting_s
    sync_s = sorted(weight_sync_s)
    use = TimeUse(
        learner_wall_s=learner_wall_s,
        learner_train_s=learner_train_s,
        learner_wait_s=learner_wait_s,
        learner_wait_fraction=learner_wait_s / learner_wall_s if learner_wall_s > 0 else None,
        learner_train_s_mean=learner_train_s / num_steps if num_steps else None,
        workers_generating_s=generating_s,
        workers_gated_s=gated_s,
        workers_waiting_for_tasks_s=waiting_s,
        workers_gated_fraction=gated_s / worker_s if worker_s > 0 else None,
        weight_sync_mean_s=sum(sync_s) / len(sync_s) if sync_s else None,
        weight_sync_p95_s=percentile(sync_s, 0.95),
        swap_pause_mean_s=swap_pause_mean_s,
        stale_tokens_dropped=stale_tokens_dropped,
        verdict="too early",
        verdict_line="",
    )
    verdict = decide(use, num_steps, synchronous)
    return use.model_copy(update={"verdict": verdict, "verdict_line": explain(use, verdict)})


def decide(use: TimeUse, num_steps: int, synchronous: bool = False) -> Verdict:
    """The module docstring's rule."""
    if num_steps < MIN_STEPS or use.learner_wait_fraction is None or use.workers_gated_fraction is None:
        return "too early"
    if use.learner_wait_fraction < WAIT_FRACTION_BOUND:
        return "learner-bound"
    worker_s = use.workers_generating_s + use.workers_gated_s + use.workers_waiting_for_tasks_s
    if not synchronous and use.workers_waiting_for_tasks_s >= FEED_FRACTION_BOUND * worker_s:
        return "feed-bound"
    sync_to_train = (
        use.weight_sync_p95_s / use.learner_train_s_mean
        if use.weight_sync_p95_s is not None and use.learner_train_s_mean
        else 0.0
    )
    # an async run waits for weights only through the gate; a pull run waits for every version's
    if use.workers_gated_fraction >= GATED_FRACTION_BOUND or (synchronous and sync_to_train >= SYNC_TO_TRAIN_BOUND):
        return "sync-bound"
    return "generation-bound"


def explain(use: TimeUse, verdict: Verdict) -> str:
    """The verdict, its advice and the numbers behind it, in one line (docs/operations.md#where-the-time-goes)."""
    parts = [f"{verdict}: {VERDICT_ADVICE[verdict]}"]
    if use.learner_wait_fraction is not None:
        parts.append(f"the learner waited {use.learner_wait_fraction:.0%} of its time for rollouts")
    worker_s = use.workers_generating_s + use.workers_gated_s + use.workers_waiting_for_tasks_s
    if worker_s > 0:
        parts.append(
            f"workers generated {use.workers_generating_s / worker_s:.0%} of theirs, held by the staleness gate "
            f"{use.workers_gated_s / worker_s:.0%}, waited for tasks {use.workers_waiting_for_tasks_s / worker_s:.0%}"
        )
    if use.weight_sync_p95_s is not None and use.learner_train_s_mean is not None:
        parts.append(f"T_bcast p95 {use.weight_sync_p95_s:.2f} s vs T_train {use.learner_train_s_mean:.2f} s")
    return "; ".join(parts)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile of ascending values, nearest rank (None: no values)."""
    if not sorted_values:
        return None
    rank = math.ceil(q * len(sorted_values) - 1e-9)  # 1-based; the epsilon keeps q * n = 19.000000001 at 19
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]
