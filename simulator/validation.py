"""Validate the simulator against a real run: feed it the run's measured inputs, compare learner utilization.

Measured from the real run (runs/<id>/metrics.jsonl and the coordinator's /v1/dashboard, polled while
it ran), over the steady window (steps after `warmup_steps`):
    utilization   sum(train_s) / (wall_s[last] - wall_s[first - 1])
    T_train       mean train_s;   T_over  mean of (wall step - train_s - idle_s)
    T_read        10th percentile of idle_s: reading and decoding a batch costs the learner this much
                  even when the groups are already there (the learner books it as idle)
    mu_i          each worker's reported samples/s, averaged over the polls of the window
    T_bcast       the coordinator's measured broadcast seconds (0 when it has none)
    scoring_s     median of scored_at_s - rollout.created_at_s over the run's scored groups (Redis streams)
    loop_s        a worker's time between two engine calls when tasks were waiting (gate check, read,
                  publish + ack): median over consecutive batches, from the rollouts and tasks streams
    engine        each worker's engine call time as a + b * groups (least squares over its calls): a small
                  model decodes a 4-group batch almost as slowly as a 16-group one, so the simulator gets
                  the fixed cost a (call_overhead_s) and the marginal rate G / b (mu_i), not the average
    reward loop   the reward service tops up freed task slots once a turn: right after scoring a batch,
                  or when its read block (RL_ROLLOUTS_BLOCK_MS, 50 ms) runs out; it publishes tasks one by
                  one, so a worker blocked on the tasks stream wakes with the first task alone
The simulator gets those, the run file's G, B, S, k, M and batch cap, and predicts utilization; the
analytic capacity model (shared.capacity) predicts it too, from the same inputs.

Continuous runs ([rollout] batching = "continuous"; simulator/continuous.py): a worker is modelled row by
row, not call by call. From the scored groups (`measure_lengths`, part of `measure_pipeline`):
    lengths       length factors = each sample's completion tokens / their mean over the run (stored as 100
                  equal-probability quantiles), and that mean
    decode step   each worker's wall seconds per decoding step, loop and in-flight weight loads included:
                  a continuous group's generation_s runs from its lease to its last row's end, which is
                  its longest sample's tokens in steps, so step_s = sum(generation_s) / sum(longest tokens)
The simulator's worker then holds R = [rollout] continuous_max_rows rows, a row of length factor f lasts
f * mean tokens * step_s, i.e. mu_i = R / (mean tokens * step_s) at full occupancy (the measured step time
is the run's own, at its own occupancy); without decode steps it falls back on the dashboard's samples/s.
Batch runs are predicted exactly as before: their a + b * groups fit already holds each call's longest
sample, so their length factors are measured but not used.

The API, in either mode, on a run's records as data (the simulator starts no cluster: a benchmark runs one with
benchmarks/measured_cluster.py `run_cluster`, which returns steps, polls, pipeline and run):
    measured = measure_run(run, steps, polls, warmup_steps, pipeline)   # pipeline = measure_pipeline(bus)
    row = predict(run, measured, reward_poll_s=0.05, max_groups_per_batch=16)
`predict` takes the mode from `run.rollout.batching` (max_groups_per_batch is batch mode's cap; a continuous
worker's is `run.rollout.continuous_max_rows`) and returns the measured, simulated and analytic
utilization, their relative errors, and the simulated stale drops and staleness.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shared.api import DashboardResponse, WorkerState
from shared.bus import StreamBus
from shared.capacity import CapacityInputs, assess
from shared.config import RunConfig
from shared.messages import ScoredGroup, unpack_int32
from shared.run_records import StepRecord
from shared.streams import SCORED, TASKS
from simulator.engine import SimConfig, simulate
from simulator.fleet import WorkerSpec


@dataclass(frozen=True)
class MeasuredRun:
    run_id: str
    num_workers: int
    staleness_bound: int
    publish_every: int
    num_steps: int  # steps in the steady window
    utilization: float
    train_s: float
    step_overhead_s: float
    idle_s: float
    read_s: float
    worker_samples_per_s: dict[str, float]
    group_latency_s: float
    broadcast_s: float
    max_trained_staleness: int
    scoring_s: float = 0.0
    loop_s: float = 0.0
    engine_fixed_s: float = 0.0  # mean a over workers
    engine_samples_per_s: dict[str, float] | None = None  # G / b per worker id (None: use the averages)
    batching: str = "batch"  # the run's [rollout] batching
    mean_completion_tokens: float = 0.0
    length_factors: tuple[float, ...] = ()  # completion tokens / their mean: 100 equal-probability quantiles
    decode_step_s: dict[str, float] | None = None  # continuous: wall seconds per decoding step, per worker id
    group_generation_s: float = 0.0  # mean generation_s of the scored groups (continuous: lease to last row)


def measure_run(
    run: RunConfig,
    steps: list[StepRecord],
    polls: list[DashboardResponse],
    warmup_steps: int,
    pipeline: dict[str, Any] | None = None,
) -> MeasuredRun:
    """`steps`: the StepRecords of metrics.jsonl; `polls`: /v1/dashboard answers seen during the run;
    `pipeline`: `measure_pipeline` of its streams."""
    window = [s for s in steps if s.step > warmup_steps]
    if len(window) < 5:
        raise ValueError(f"only {len(window)} steps after the warm-up of {warmup_steps}: run longer")
    before = [s for s in steps if s.step == warmup_steps]
    start_wall_s = before[0].wall_s if before else window[0].wall_s - window[0].train_s - window[0].idle_s
    wall_s = window[-1].wall_s - start_wall_s
    train_s = sum(s.train_s for s in window)
    idle_s = sum(s.idle_s for s in window)
    first_step, last_step = window[0].step, window[-1].step
    steady = [
        p for p in polls if p.learner is not None and first_step <= p.learner.learner_version <= last_step
    ] or polls
    mu: dict[str, list[float]] = {}
    latencies, broadcasts = [], []
    for poll in steady:
        for w in poll.workers:
            if w.state == WorkerState.ACTIVE and w.samples_per_s > 0:
                mu.setdefault(w.name, []).append(w.samples_per_s)
                if w.group_latency_s:
                    latencies.append(w.group_latency_s)
        inputs = poll.capacity.inputs
        if inputs is not None and inputs.broadcast_s:
            broadcasts.append(inputs.broadcast_s)
    return MeasuredRun(
        run_id=run.run_id,
        num_workers=len(mu),
        staleness_bound=run.schedule.staleness_bound,
        publish_every=run.schedule.publish_every,
        num_steps=len(window),
        utilization=train_s / wall_s,
        train_s=train_s / len(window),
        step_overhead_s=max(0.0, wall_s - train_s - idle_s) / len(window),
        idle_s=idle_s / len(window),
        read_s=statistics.quantiles([s.idle_s for s in window], n=10)[0],
        worker_samples_per_s={name: statistics.fmean(values) for name, values in sorted(mu.items())},
        group_latency_s=statistics.fmean(latencies) if latencies else 0.0,
        broadcast_s=statistics.fmean(broadcasts) if broadcasts else 0.0,
        max_trained_staleness=max(int(lag) for s in window for lag in s.staleness_histogram),
        batching=run.rollout.batching,
        **(pipeline or {}),
    )


def measure_lengths(groups: Sequence[ScoredGroup], num_quantiles: int = 100) -> dict[str, Any]:
    """Completion lengths and continuous workers' decode steps from scored groups (module docstring)."""
    lengths = [unpack_int32(g.rollout.completion_lengths) for g in groups]
    tokens = sorted(int(n) for group in lengths for n in group)
    if not tokens or sum(tokens) == 0:
        return {"mean_completion_tokens": 0.0, "length_factors": (), "decode_step_s": None, "group_generation_s": 0.0}
    mean_tokens = statistics.fmean(tokens)
    picks = (
        [tokens[int((i + 0.5) * len(tokens) / num_quantiles)] for i in range(num_quantiles)]
        if len(tokens) > num_quantiles
        else tokens
    )
    seconds: dict[str, float] = {}
    steps: dict[str, int] = {}
    for group, group_lengths in zip(groups, lengths, strict=True):
        worker_id = group.rollout.worker_id
        seconds[worker_id] = seconds.get(worker_id, 0.0) + group.rollout.generation_s
        steps[worker_id] = steps.get(worker_id, 0) + int(group_lengths.max())
    return {
        "mean_completion_tokens": round(mean_tokens, 3),
        "length_factors": tuple(round(n / mean_tokens, 4) for n in picks),
        "decode_step_s": {w: seconds[w] / steps[w] for w in sorted(seconds) if steps[w] > 0} or None,
        "group_generation_s": statistics.fmean(g.rollout.generation_s for g in groups),
    }


def measure_pipeline(bus: StreamBus) -> dict[str, Any]:
    """Data-plane latencies and completion lengths (`measure_lengths`) from the run's streams (entries stay
    until the run's Redis goes)."""
    tasks = {task.task_id: task.created_at_s for task in bus.entries(TASKS)}
    scored = bus.entries(SCORED)
    scoring = [g.scored_at_s - g.rollout.created_at_s for g in scored]
    batches: dict[tuple[str, float], list] = {}  # (worker, generation_s) -> its groups: one engine call
    for g in scored:
        batches.setdefault((g.rollout.worker_id, g.rollout.generation_s), []).append(g.rollout)
    by_worker: dict[str, list[tuple[float, float, float]]] = {}  # worker -> (start, end, last task created)
    for (worker_id, generation_s), groups in batches.items():
        end = max(r.created_at_s for r in groups)
        start = min(r.created_at_s for r in groups) - generation_s
        by_worker.setdefault(worker_id, []).append((start, end, max(tasks.get(r.task_id, 0.0) for r in groups)))
    gaps = []
    for spans in by_worker.values():
        spans.sort()
        for (_, end, _), (start, _, created) in zip(spans, spans[1:], strict=False):
            if created <= end:  # its tasks were waiting when the previous call ended: pure loop overhead
                gaps.append(start - end)
    fits = {}  # worker id -> (a, b): generation_s = a + b * num_groups
    for worker_id in by_worker:
        calls = [(len(groups), generation_s) for (wid, generation_s), groups in batches.items() if wid == worker_id]
        if len({n for n, _ in calls}) >= 2:
            slope, intercept = statistics.linear_regression([n for n, _ in calls], [t for _, t in calls])
            if slope > 0:
                fits[worker_id] = (max(0.0, intercept), slope)
    group_size = scored[0].rollout.num_samples if scored else 1
    return {
        "scoring_s": statistics.median(scoring) if scoring else 0.0,
        "loop_s": statistics.median(gaps) if gaps else 0.0,
        "engine_fixed_s": statistics.fmean(a for a, _ in fits.values()) if fits else 0.0,
        "engine_samples_per_s": {w: group_size / b for w, (_, b) in fits.items()} or None,
        **measure_lengths(scored),
    }


def predict(
    run: RunConfig, measured: MeasuredRun, *, reward_poll_s: float, max_groups_per_batch: int, seed: int = 0
) -> dict:
    """The simulator's and the capacity model's utilization for the measured inputs, in the run's batching
    mode (`run.rollout.batching`; `max_groups_per_batch` is batch mode's cap)."""
    engine = engine_model(run, measured)
    workers = [WorkerSpec(name, "cpu", 0.0, mu, 1000.0, 0.0, float("inf")) for name, mu in engine.rates.items()]
    config = simulation_config(
        run, measured, engine, reward_poll_s=reward_poll_s, max_groups_per_batch=max_groups_per_batch, seed=seed
    )
    result = simulate(config, workers)
    analytic = assess(capacity_inputs(run, measured, engine, reward_poll_s=reward_poll_s))
    simulated = result.utilization
    return {
        "measured": asdict(measured),
        "simulated_utilization": round(simulated, 4),
        "analytic_utilization": round(analytic.predicted_utilization, 4),
        "measured_utilization": round(measured.utilization, 4),
        "simulator_relative_error": round((simulated - measured.utilization) / measured.utilization, 4),
        "analytic_relative_error": round(
            (analytic.predicted_utilization - measured.utilization) / measured.utilization, 4
        ),
        "simulated_max_staleness": max(result.staleness_histogram, default=0),
        "simulated_dropped_stale": result.num_dropped_stale,
        "simulated_stale_fraction": round(
            result.num_dropped_stale / max(1, result.num_dropped_stale + result.num_trained_groups), 4
        ),
        "assumed": {
            "reward_poll_s": reward_poll_s,
            "max_groups_per_batch": max_groups_per_batch,
            "batching": run.rollout.batching,
            "engine": engine.description,
        },
    }


def simulation_config(
    run: RunConfig,
    measured: MeasuredRun,
    engine: EngineModel,
    *,
    reward_poll_s: float,
    max_groups_per_batch: int,
    seed: int = 0,
) -> SimConfig:
    """The simulator's inputs: the run file's G, B, S, k, M and batch cap, and the measured costs."""
    return SimConfig(
        group_size=run.grpo.group_size,
        groups_per_step=run.grpo.groups_per_step,
        num_steps=max(50, measured.num_steps),
        train_s=measured.train_s,
        staleness_bound=run.schedule.staleness_bound,
        publish_every=run.schedule.publish_every,
        step_overhead_s=measured.step_overhead_s,
        batch_read_s=measured.read_s,
        max_groups_in_flight=run.max_groups_in_flight,
        max_groups_per_batch=max_groups_per_batch,
        call_overhead_s=engine.call_overhead_s,
        scoring_s=measured.scoring_s,
        reward_poll_s=reward_poll_s,
        trickle_tasks=True,
        fixed_broadcast_s=measured.broadcast_s,
        seed=seed,
        batching=run.rollout.batching,
        length_factors=engine.length_factors,
        continuous_max_rows=run.rollout.continuous_max_rows if run.rollout.batching == "continuous" else 0,
        admission=run.schedule.admission,
    )


def capacity_inputs(
    run: RunConfig, measured: MeasuredRun, engine: EngineModel, *, reward_poll_s: float
) -> CapacityInputs:
    """The analytic capacity model's inputs (shared.capacity), from the same measurements."""
    return CapacityInputs(
        samples_per_step=run.grpo.group_size * run.grpo.groups_per_step,
        train_s=measured.train_s,
        staleness_bound=run.schedule.staleness_bound,
        publish_every=run.schedule.publish_every,
        step_overhead_s=measured.step_overhead_s + measured.read_s,
        broadcast_s=measured.broadcast_s,
        # continuous: the dashboard's latency is one decoding step's; a group lasts lease to last row
        group_latency_s=measured.group_generation_s if engine.continuous else measured.group_latency_s,
        queue_delay_s=measured.scoring_s + reward_poll_s / 2,
        worker_samples_per_s=tuple(measured.worker_samples_per_s.values()),
    )


@dataclass(frozen=True)
class EngineModel:
    """How `predict` models the run's workers."""

    rates: dict[str, float]  # mu_i, samples/s, by worker
    call_overhead_s: float  # batch: per call
    length_factors: tuple[float, ...]  # continuous: per row; batch: () (the fit holds the longest sample)
    description: str
    continuous: bool = False


def engine_model(run: RunConfig, measured: MeasuredRun) -> EngineModel:
    """Batch: the affine fit a + b * groups (else the average samples/s). Continuous: rows of the measured
    lengths, mu_i = R / (mean completion tokens * decode step_s) (module docstring)."""
    if run.rollout.batching == "continuous":
        factors = tuple(measured.length_factors)
        if measured.decode_step_s and measured.mean_completion_tokens > 0:
            max_rows = run.rollout.continuous_max_rows
            rates = {
                worker: max_rows / (measured.mean_completion_tokens * step_s)
                for worker, step_s in measured.decode_step_s.items()
            }
            return EngineModel(rates, 0.0, factors, "rows: R / (mean tokens * step_s)", continuous=True)
        return EngineModel(measured.worker_samples_per_s, 0.0, factors, "rows: average samples/s", continuous=True)
    if measured.engine_samples_per_s:  # the affine engine model: a fixed cost per call, then G / b per group
        call_overhead_s = measured.loop_s + measured.engine_fixed_s
        return EngineModel(measured.engine_samples_per_s, call_overhead_s, (), "a + b * groups")
    return EngineModel(measured.worker_samples_per_s, measured.loop_s, (), "average samples/s")
