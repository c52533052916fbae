"""The capacity model's inputs, measured from what the coordinator sees in Redis.

R        grpo.group_size * grpo.groups_per_step (run file)
T_train  LearnerState: d(train_s_total) / d(num_steps_done) over the last `window_s` seconds of
         learner states (the whole run's mean until the window holds `MIN_WINDOW_STEPS` steps)
T_over   the same window: (d(wall) - d(train) - d(idle)) / d(steps)  (publish, eval, checkpoint)
T_bcast  median of the newest `NUM_BROADCASTS` entries of RunKeys.broadcast_times (0 when none yet);
         each entry is already the fleet's 90% quantile, not its slowest worker (broadcast_times.py)
L_gen    the largest group_latency_s an active worker reports (worst case: freshness is a bound), each
         capped at 4x the active workers' low median first (shared/capacity.py `capped_at_median`)
D        groups finished but not read by the learner (rollouts backlog + scored lag) beyond one
         batch, in batches of groups_per_step, times C: how many extra steps the newest waits
         (waiting for the next batch read itself is already in the model's ceil)
mu_i     samples_per_s of every ACTIVE worker that has measured one, capped the same way

Every per-worker number here is the worker's own report. Robust statistics keep one slow, silent or
lying worker from stalling or skewing the model: a median over versions, a quantile over the fleet
within a version, and a cap at 4x the low median per worker (one liar adds at most 4x the largest
honest rate to M, and L_gen is at most 4x the largest honest latency).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

import redis

from services.coordinator.measurements import BAD_MEASUREMENTS, bounded_hash
from shared.api import MAX_DURATION_S, WorkerInfo, WorkerState
from shared.bus import StreamBus
from shared.capacity import CapacityInputs, capped_at_median
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import LearnerState
from shared.streams import ROLLOUTS, SCORED

MIN_WINDOW_STEPS = 3
NUM_BROADCASTS = 10


@dataclass(frozen=True)
class LearnerSnapshot:
    at_s: float
    num_steps: int
    train_s_total: float
    idle_s_total: float
    wall_s: float

    @classmethod
    def of(cls, state: LearnerState) -> LearnerSnapshot:
        return cls(time.monotonic(), state.num_steps_done, state.train_s_total, state.idle_s_total, state.wall_s)


@dataclass(frozen=True)
class StepTimes:
    train_s: float
    overhead_s: float
    idle_s: float
    num_steps: int  # steps the means cover
    source: str  # "window" or "run"


class LearnerWindow:
    """Learner states seen over the last `window_s` seconds (one per distinct step count)."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._snapshots: deque[LearnerSnapshot] = deque()

    def observe(self, state: LearnerState | None) -> None:
        if state is None or state.num_steps_done == 0:
            return
        snapshot = LearnerSnapshot.of(state)
        if self._snapshots and snapshot.num_steps < self._snapshots[-1].num_steps:
            self._snapshots.clear()  # a restarted learner resumed from an older checkpoint
        if not self._snapshots or snapshot.num_steps != self._snapshots[-1].num_steps:
            self._snapshots.append(snapshot)
        while len(self._snapshots) > 2 and self._snapshots[0].at_s < snapshot.at_s - self.window_s:
            self._snapshots.popleft()

    def step_times(self, state: LearnerState | None) -> StepTimes | None:
        """Mean seconds per step; None before the learner has taken a step."""
        if len(self._snapshots) >= 2:
            first, last = self._snapshots[0], self._snapshots[-1]
            num_steps = last.num_steps - first.num_steps
            if num_steps >= MIN_WINDOW_STEPS:
                return _means(
                    last.train_s_total - first.train_s_total,
                    last.idle_s_total - first.idle_s_total,
                    last.wall_s - first.wall_s,
                    num_steps,
                    "window",
                )
        if state is None or state.num_steps_done == 0:
            return None
        return _means(state.train_s_total, state.idle_s_total, state.wall_s, state.num_steps_done, "run")


def _means(train_s: float, idle_s: float, wall_s: float, num_steps: int, source: str) -> StepTimes | None:
    """Per-step means; None (and counted) when the learner's totals give no sane ones (non-finite, negative
    or longer than MAX_DURATION_S a step: services/coordinator/measurements.py)."""
    overhead_s = max(0.0, wall_s - train_s - idle_s)
    means = (train_s / num_steps, overhead_s / num_steps, idle_s / num_steps)
    if not all(0.0 <= m <= MAX_DURATION_S for m in means):  # NaN fails too
        BAD_MEASUREMENTS.count("learner.step_times", means)
        return None
    return StepTimes(*means, num_steps, source)


@dataclass(frozen=True)
class MeasuredInputs:
    inputs: CapacityInputs | None  # None until T_train is measured
    step_times: StepTimes | None
    sources: dict[str, str]  # input name -> where it came from
    queued_groups: int
    active_samples_per_s: dict[str, float]  # mu_i by worker id (measured active workers)


def recent_broadcast_s(client: redis.Redis, keys: RunKeys) -> float | None:
    """Median T_bcast of the newest measured versions (one outlier version does not move it), None when none."""
    raw = client.hgetall(keys.broadcast_times)
    by_version = sorted(
        (int(v), s) for v, s in bounded_hash(raw, "broadcast.times", 0.0, MAX_DURATION_S, int_keys=True).items()
    )
    if not by_version:
        return None
    return statistics.median(seconds for _, seconds in by_version[-NUM_BROADCASTS:])


def queued_groups(bus: StreamBus) -> int:
    """Groups generated but not yet read by the learner."""
    rollouts = bus.backlog(ROLLOUTS)
    scored_lag, _ = bus.group_progress(SCORED)
    return rollouts + scored_lag


def measure_inputs(
    run: RunConfig,
    state: LearnerState | None,
    window: LearnerWindow,
    workers: list[WorkerInfo],
    broadcast_s: float | None,
    num_queued_groups: int,
) -> MeasuredInputs:
    active = [w for w in workers if w.state == WorkerState.ACTIVE]
    latencies = list(
        capped_at_median({w.worker_id: w.group_latency_s for w in active if w.group_latency_s > 0}).values()
    )
    step_times = window.step_times(state)
    sources = {
        "samples_per_step": "run file: group_size * groups_per_step",
        "train_s": f"learner state ({step_times.source} mean over {step_times.num_steps} steps)"
        if step_times
        else "unknown",
        "step_overhead_s": "learner state: wall - train - idle per step" if step_times else "unknown",
        "broadcast_s": "broadcast_times (median of newest versions)"
        if broadcast_s is not None
        else "not measured yet: 0",
        "group_latency_s": "max over active workers' heartbeats, each capped at 4x their median"
        if latencies
        else "not measured yet: 0",
        "queue_delay_s": "rollouts backlog + scored lag beyond one batch, in batches, times C",
        "worker_samples_per_s": "active workers' heartbeats (measured ones only), each capped at 4x their median",
    }
    measured_mu = capped_at_median({w.worker_id: w.samples_per_s for w in active if w.samples_per_s > 0})
    if step_times is None or step_times.train_s <= 0:
        return MeasuredInputs(None, step_times, sources, num_queued_groups, measured_mu)
    staleness_bound = state.staleness_bound if state is not None else run.schedule.staleness_bound
    min_step_s = step_times.train_s + step_times.overhead_s
    inputs = CapacityInputs(
        samples_per_step=run.grpo.group_size * run.grpo.groups_per_step,
        train_s=step_times.train_s,
        staleness_bound=staleness_bound,
        publish_every=run.schedule.publish_every,
        step_overhead_s=step_times.overhead_s,
        broadcast_s=broadcast_s or 0.0,
        group_latency_s=max(latencies, default=0.0),
        queue_delay_s=max(0, num_queued_groups - run.grpo.groups_per_step) / run.grpo.groups_per_step * min_step_s,
        worker_samples_per_s=tuple(measured_mu.values()),
    )
    return MeasuredInputs(inputs, step_times, sources, num_queued_groups, measured_mu)
