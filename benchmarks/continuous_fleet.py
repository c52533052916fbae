"""Fleet prediction: batch vs continuous workers at 100 and 1,000 heterogeneous workers (simulated).

    python -m benchmarks.continuous_fleet            # or: make bench-continuous-fleet (~4 min on 2 cores)

The discrete-event simulator (simulator/engine.py, simulator/continuous.py), seeded; every number below is
an assumption, written into the result file:
- workers: median 1 sample/s at full occupancy; the slowest 10% 4x slower, the others log-normal around the
  median (sigma 0.25; simulator/fleet.py `straggler_fleet`); 16 rows each: a batch call of 2 groups of
  G = 8, or 16 continuous rows, so a mean row lasts 16 s;
- completion lengths: log-normal (sigma 0.8) length factors, cut at 4x the untruncated mean (max_new_tokens),
  scaled to mean 1: a batch call lasts as long as its longest of 16 samples (the file records the mean of
  that longest factor: batch workers supply sum(mu_i) divided by it), a continuous row as its own;
- learner: B = sum(mu_i) * 32 s / G groups per step (32 s: two mean rows, so a group of median rows spans
  about one step); train_s so that its demand B * G / (train_s + 1 s overhead) is 1.5x the fleet's nominal
  supply sum(mu_i) (generation-bound: the learner waits) or 0.7x (learner-bound); T_bcast 3 s, scoring 0.5 s;
- S = 1, 2, 4 (max groups in flight: B * max(1, S - 1)); continuous cells admit per token (the run file's
  default, shared/staleness.py); at S = 1 also continuous workers under the oldest-token rule, and
  continuous workers that lease only while holding the newest published version
  (SimConfig.lease_newest_only; not what the worker does now).
Runs: 40 steps (100 workers) or 20 (1,000), seed 0. Per cell: the learner's busy fraction and steps/hour
over the steady window (after 10 or 6 warm-up steps), groups and tokens dropped as stale (whole run), the
trained groups' and tokens' lag histograms, the mean group age (lease to the learner's read), samples/s per
worker (median; mean of the slowest 10%) and the slowest 10%'s stale drops. `s1_investigation`: the S = 1
finding of docs/continuous_batching.md on the unit tests' small run, taken apart.
Writes benchmarks/results/continuous_fleet.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.result_file import write_result
from simulator.continuous import ContinuousSimulation
from simulator.engine import SimConfig, Simulation
from simulator.fleet import WorkerSpec, straggler_fleet

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "continuous_fleet.json"

GROUP_SIZE = 8
ROWS_PER_WORKER = 16
MEDIAN_SAMPLES_PER_S = 1.0
SLOW_FRACTION, SLOW_FACTOR, SPREAD_SIGMA = 0.1, 4.0, 0.25
LENGTH_SIGMA, LENGTH_CAP = 0.8, 4.0
REFERENCE_PERIOD_S = 32.0  # B * G samples at the fleet's nominal supply
STEP_OVERHEAD_S = 1.0
BROADCAST_S = 3.0
SCORING_S = 0.5
LOADS = {"generation_bound": 1.5, "learner_bound": 0.7}  # learner demand / fleet supply
FLEET_SIZES = (100, 1000)
STALENESS_BOUNDS = (1, 2, 4)
STEPS = {100: (40, 10), 1000: (20, 6)}  # workers -> (steps, warm-up steps): 1,000 workers simulate 10x the rows
SEED = 0


def lognormal_length_factors(num_points: int = 1000) -> tuple[float, ...]:
    """Equal-probability quantiles of a log-normal, cut at LENGTH_CAP x its mean, scaled to mean 1."""
    normal = statistics.NormalDist()
    mean = math.exp(LENGTH_SIGMA**2 / 2)
    raw = [
        min(LENGTH_CAP * mean, math.exp(LENGTH_SIGMA * normal.inv_cdf((i + 0.5) / num_points)))
        for i in range(num_points)
    ]
    scale = statistics.fmean(raw)
    return tuple(round(x / scale, 4) for x in raw)


def mean_longest_factor(num_samples: int, num_draws: int = 20_000) -> float:
    """E[max of `num_samples` length factors]: how much longer than a mean sample a batch call lasts."""
    rng = random.Random(SEED)
    factors = lognormal_length_factors()
    return statistics.fmean(max(rng.choices(factors, k=num_samples)) for _ in range(num_draws))


def cell_config(
    workers: list[WorkerSpec], load: float, staleness_bound: int, batching: str, num_steps: int
) -> SimConfig:
    supply = sum(w.samples_per_s for w in workers)
    groups_per_step = round(supply * REFERENCE_PERIOD_S / GROUP_SIZE)
    period_s = groups_per_step * GROUP_SIZE / (load * supply)
    return SimConfig(
        group_size=GROUP_SIZE,
        groups_per_step=groups_per_step,
        num_steps=num_steps,
        train_s=period_s - STEP_OVERHEAD_S,
        step_overhead_s=STEP_OVERHEAD_S,
        staleness_bound=staleness_bound,
        max_groups_per_batch=ROWS_PER_WORKER // GROUP_SIZE,
        fixed_broadcast_s=BROADCAST_S,
        scoring_s=SCORING_S,
        batching=batching,
        length_factors=lognormal_length_factors(),
        seed=SEED,
    )


def run_cell(workers: list[WorkerSpec], config: SimConfig, warmup_steps: int) -> dict[str, Any]:
    simulation = (ContinuousSimulation if config.batching == "continuous" else Simulation)(config, workers)
    result = simulation.run()
    ends = simulation.step_ended_at_s
    window_s = ends[-1] - ends[warmup_steps - 1]
    steady_steps = len(ends) - warmup_steps
    num_read = result.num_trained_groups + result.num_dropped_stale
    per_worker = {w.worker_id: result.worker_groups[w.worker_id] * GROUP_SIZE / result.wall_s for w in workers}
    slowest = sorted(workers, key=lambda w: w.samples_per_s)[: max(1, round(len(workers) * SLOW_FRACTION))]
    slow_ids = {w.worker_id for w in slowest}
    slow_dropped = sum(result.worker_dropped[i] for i in slow_ids)
    slow_scored = sum(result.worker_groups[i] for i in slow_ids)
    return {
        "groups_per_step": config.groups_per_step,
        "train_s": round(config.train_s, 2),
        "learner_busy_fraction": round(sum(simulation.step_train_s[warmup_steps:]) / window_s, 3),
        "steps_per_hour": round(steady_steps / window_s * 3600, 1),
        "dropped_stale_groups": result.num_dropped_stale,
        "dropped_stale_group_fraction": round(result.num_dropped_stale / num_read, 4) if num_read else 0.0,
        "dropped_stale_token_fraction": round(result.dropped_token_fraction, 4),
        "group_lag_histogram": {str(lag): n for lag, n in result.staleness_histogram.items()},
        "token_lag_histogram": {str(lag): round(f, 4) for lag, f in result.token_lag_histogram.items()},
        "mean_group_age_s": round(result.mean_group_age_s, 1),
        "worker_samples_per_s_median": round(statistics.median(per_worker.values()), 3),
        "worker_samples_per_s_slowest_10pct": round(statistics.fmean(per_worker[i] for i in slow_ids), 3),
        "slowest_10pct_dropped_fraction": round(slow_dropped / slow_scored, 4) if slow_scored else 0.0,
        "slowest_10pct_share_of_drops": round(slow_dropped / result.num_dropped_stale, 4)
        if result.num_dropped_stale
        else 0.0,
        "runtime_s": round(result.runtime_s, 1),
    }


def s1_investigation() -> dict[str, Any]:
    """The S = 1 finding on the unit tests' small run (tests/unit/test_simulator_continuous.py): 4 workers of
    200 samples/s, 8 groups of G = 8 each, B = 32, train_s 0.2 s, T_bcast 0.1 s, geometric lengths."""
    geometric = tuple(k / 15.0 for k in range(1, 121) for _ in range(round(1000 * (14 / 15) ** (k - 1) / 15)))
    base = SimConfig(
        group_size=8,
        groups_per_step=32,
        num_steps=60,
        train_s=0.2,
        staleness_bound=1,
        max_groups_per_batch=8,
        fixed_broadcast_s=0.1,
        scoring_s=0.01,
        length_factors=geometric,
    )

    def fleet(samples_per_s: float) -> list[WorkerSpec]:
        return [WorkerSpec(f"w{i}", "cpu", 0.0, samples_per_s, 1000.0, 0.0, math.inf) for i in range(4)]

    cases = {
        "batch": (base, 200.0),
        "continuous": (dataclasses.replace(base, batching="continuous"), 200.0),
        "batch, workers 1.5x faster (the continuous run's step period)": (base, 300.0),
        "continuous, workers 0.75x (the batch run's step period)": (
            dataclasses.replace(base, batching="continuous"),
            150.0,
        ),
        "continuous, leasing only on the newest version": (
            dataclasses.replace(base, batching="continuous", lease_newest_only=True),
            200.0,
        ),
    }
    rows = {}
    for name, (config, samples_per_s) in cases.items():
        simulation = (ContinuousSimulation if config.batching == "continuous" else Simulation)(
            config, fleet(samples_per_s)
        )
        result = simulation.run()
        rows[name] = {
            "step_period_s": round(result.wall_s / result.num_steps, 3),
            "dropped_stale_groups": result.num_dropped_stale,
            "trained_groups": result.num_trained_groups,
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.continuous_fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--fleet-sizes", type=int, nargs="+", default=list(FLEET_SIZES))
    args = parser.parse_args()
    started = time.monotonic()
    cells: dict[str, dict[str, Any]] = {}
    for num_workers in args.fleet_sizes:
        num_steps, warmup_steps = STEPS.get(num_workers, STEPS[100])
        workers = straggler_fleet(
            num_workers,
            MEDIAN_SAMPLES_PER_S,
            slow_fraction=SLOW_FRACTION,
            slow_factor=SLOW_FACTOR,
            sigma=SPREAD_SIGMA,
            seed=SEED,
        )
        for load_name, load in LOADS.items():
            for staleness_bound in STALENESS_BOUNDS:
                # continuous workers under the run file's default admission (per_token); at S = 1 also the
                # oldest-token rule, and leasing only with the newest version
                variants: dict[str, dict[str, Any]] = {"batch": {}, "continuous": {"admission": "per_token"}}
                if staleness_bound == 1:
                    variants["continuous_oldest_token"] = {"admission": "oldest_token"}
                    variants["continuous_newest_only"] = {"admission": "per_token", "lease_newest_only": True}
                for name, extra in variants.items():
                    batching = "batch" if name == "batch" else "continuous"
                    config = cell_config(workers, load, staleness_bound, batching, num_steps)
                    config = dataclasses.replace(config, **extra)
                    key = f"n{num_workers}_{load_name}_s{staleness_bound}_{name}"
                    cells[key] = run_cell(workers, config, warmup_steps)
                    cell = cells[key]
                    print(
                        f"{key}: busy {cell['learner_busy_fraction']:.3f}, {cell['steps_per_hour']:.0f} steps/h, "
                        f"dropped {100 * cell['dropped_stale_group_fraction']:.1f}% of groups, "
                        f"age {cell['mean_group_age_s']:.0f} s ({cell['runtime_s']:.1f} s)",
                        flush=True,
                    )
    result = {
        "command": "python -m benchmarks.continuous_fleet",
        "assumptions": {
            "group_size": GROUP_SIZE,
            "rows_per_worker": ROWS_PER_WORKER,
            "median_samples_per_s": MEDIAN_SAMPLES_PER_S,
            "slowest_fraction": SLOW_FRACTION,
            "slowest_factor": SLOW_FACTOR,
            "others_lognormal_sigma": SPREAD_SIGMA,
            "length_factors": f"log-normal sigma {LENGTH_SIGMA}, cut at {LENGTH_CAP}x its mean, scaled to mean 1",
            "batch_call_longest_factor_mean": round(mean_longest_factor(ROWS_PER_WORKER), 3),
            "groups_per_step": f"sum(mu_i) * {REFERENCE_PERIOD_S} s / G",
            "loads": {name: f"learner demand = {load}x sum(mu_i)" for name, load in LOADS.items()},
            "step_overhead_s": STEP_OVERHEAD_S,
            "broadcast_s": BROADCAST_S,
            "scoring_s": SCORING_S,
            "steps_and_warmup_by_workers": {str(n): list(steps) for n, steps in STEPS.items()},
            "seed": SEED,
        },
        "cells": cells,
        "s1_investigation": s1_investigation(),
        "runtime_s": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
