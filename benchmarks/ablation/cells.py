"""One cell of the staleness ablation: its run file, its real local-cluster run, and what it measured.

A cell is (S, correction, seed) on the demo task (configs/demo.toml), or the pull-mode baseline. Every
cell trains the same number of learner steps. What varies with the seed: the tiny model's random
initialisation and the task's held-out split and prompt stream (`[model] seed`, `[task] seed`).

Staleness is made to occur (benchmarks/ablation/README in docs/staleness_ablation.md): the data plane
queues one step of groups (`[data] max_groups_in_flight = groups_per_step`), so a group is about one
version old from the pipeline alone, and each worker holds its weights back a random 0..S-1 versions
after every swap (`[rollout] hold_versions_max`, services/rollout/weight_hold.py). Trained lags then
spread over 0..S; the lags each run actually trained on are measured and reported.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.measured_cluster import run_cluster
from cluster.local import raise_keyboard_interrupt
from cluster.placement import Placement
from cluster.report import write_report
from cluster.run_report import EvalPoint, RunReport
from shared.api import DashboardResponse
from shared.config import RunConfig, load_run_config
from shared.run_file import dump_run_file, read_run_file
from shared.run_records import EvalRecord, StepRecord, read_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
REWARD_TARGET = 0.8  # "steps to reach 0.8 reward": the first step whose trailing mean reaches it
TRAILING_STEPS = 10  # final reward and the target use the mean over this many steps

log = logging.getLogger("ablation")


@dataclass(frozen=True)
class Cell:
    staleness_bound: int
    correction: str  # "truncated_is" | "none"
    seed: int
    mode: str = "async"  # "async" | "pull"
    num_steps: int = 400
    num_workers: int = 3
    # None: max(S - 1, 0) (module docstring); the pull baseline holds nothing
    hold_versions_max: int | None = None
    # None: one step of queue (groups_per_step); 0: the run file's default, groups_per_step * max(1, S - 1)
    max_groups_in_flight: int | None = None
    tag: str = ""  # distinguishes extra cells (the investigation's) from the grid's
    learning_rate: float | None = None  # None: the run file's
    run_id_prefix: str = "ablation"
    worker_price_per_hour: float = 0.0  # $/h each worker registers with (the cost ledger bills it while active)
    learner_price_per_hour: float | None = None  # None: the run file's [activation] learner_price_per_hour
    base_config: str = "configs/demo.toml"  # the run file every override applies to, from the repository root
    placement: str = ""  # cluster/placement.py's text ("learner=0 workers=1"); empty: every process on every core
    eval_on: str = ""  # [learner] eval_on ("workers" | "learner"); empty: the run file's
    engine: str = ""  # [rollout] engine ("torch" | "vllm"); empty: the run file's

    @property
    def key(self) -> str:
        name = "pull" if self.mode == "pull" else f"S{self.staleness_bound}-{self.correction}"
        eval_on = f"-eval-{self.eval_on}" if self.eval_on else ""
        return f"{name}{'-' + self.tag if self.tag else ''}{eval_on}-seed{self.seed}"

    @property
    def hold(self) -> int:
        if self.mode == "pull":
            return 0
        return max(self.staleness_bound - 1, 0) if self.hold_versions_max is None else self.hold_versions_max

    def run_file(self, base: Path | None = None) -> dict[str, Any]:
        raw = read_run_file(base or REPO_ROOT / self.base_config)
        raw["run_id"] = self.run_id_prefix
        if self.learner_price_per_hour is not None:
            raw.setdefault("activation", {})["learner_price_per_hour"] = self.learner_price_per_hour
        raw.setdefault("model", {})["seed"] = self.seed
        raw.setdefault("task", {})["seed"] = self.seed
        grpo, schedule = raw.setdefault("grpo", {}), raw.setdefault("schedule", {})
        grpo["off_policy_correction"] = self.correction
        if self.learning_rate is not None:
            grpo["learning_rate"] = self.learning_rate
        schedule |= {"staleness_bound": self.staleness_bound, "num_steps": self.num_steps, "mode": self.mode}
        schedule["max_wall_s"] = 3600.0  # equal learner steps: the step count ends every run
        raw.setdefault("rollout", {})["hold_versions_max"] = self.hold
        if self.eval_on:
            raw.setdefault("learner", {})["eval_on"] = self.eval_on
        if self.engine:
            raw.setdefault("rollout", {})["engine"] = self.engine
        # The trust score's honest band is calibrated at lags 0-2 (docs/trust.md): at lag 7+ an honest
        # worker's mean |log mu - log pi_prox| leaves it and the worker is quarantined, which would end
        # the run's supply of groups. Trust is not what a cell measures: off.
        raw["trust"] = {"enabled": False}
        if self.max_groups_in_flight is None:
            raw.setdefault("data", {})["max_groups_in_flight"] = grpo.get("groups_per_step", 64)
        elif self.max_groups_in_flight:
            raw.setdefault("data", {})["max_groups_in_flight"] = self.max_groups_in_flight
        return raw


@dataclass
class CellResult:
    key: str
    cell: dict[str, Any]
    run_id: str
    num_steps: int
    final_reward: float  # mean reward over the last TRAILING_STEPS steps
    eval_accuracy_final: float | None  # held-out greedy accuracy of the final weights
    eval_curve: list[tuple[int, float]]  # (version, held-out accuracy)
    steps_to_target: int | None  # first step whose trailing mean reward reaches REWARD_TARGET
    reward_curve: list[float]  # per step
    lag_histogram: dict[str, int]  # trained groups by lag over the run
    num_dropped: dict[str, int]
    wall_s: float
    busy_fraction: float
    steps_per_hour: float
    is_weight_mean: float | None  # means over steps of the learner's diagnostics (None: no step)
    truncated_fraction: float
    cost_usd: float | None
    predicted_utilization: float | None  # the capacity model's, median over the run's dashboard polls
    # (learner version, the ledger's total $) as the dashboard showed them, about once a second
    cost_curve: list[tuple[int, float]] = field(default_factory=list)
    worker_samples_per_s: float | None = None  # mean over workers and polls of each one's measured rate
    train_s_per_step: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# (run config, step records, dashboard polls, data-plane latencies) -> what to keep in CellResult.extra
CellAnalysis = Callable[[RunConfig, list[StepRecord], list[DashboardResponse], dict[str, float]], dict[str, Any]]


def run_cell(cell: Cell, runs_dir: Path, analyse: CellAnalysis | None = None) -> CellResult:
    """Run the cell's cluster to its last step (real processes, stopped by PID) and measure it; `analyse`
    adds its own figures (benchmarks/async_vs_sync.py: the simulator's prediction) to the result's extra."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_file = runs_dir / f"{cell.key}.source.toml"
    run_file.write_text(dump_run_file(cell.run_file()))
    load_run_config(run_file)  # a bad cell fails here, before any process starts
    price = {"RL_WORKER_PRICE_PER_HOUR": str(cell.worker_price_per_hour)}
    worker_env = {f"worker-{index}": price for index in range(cell.num_workers)}
    options = {"placement": Placement.parse(cell.placement, cell.num_workers)} if cell.placement else {}
    steps, polls, pipeline, run = run_cluster(
        cell.key, run_file, cell.num_workers, {}, runs_dir, worker_env, options=options
    )
    run_dir = runs_dir / run.run_id
    report = write_report(run_dir, run, None, wall_s=steps[-1].wall_s if steps else 0.0)
    _, evals = read_metrics(run_dir / "metrics.jsonl")
    result = summarize(cell, run.run_id, steps, evals, report, polls)
    # each evaluation whole (who ran it, how long, format and chance), and where the time went at the end
    result.extra["evals"] = [EvalPoint.of(record).model_dump() for record in evals]
    result.extra["wall_s_by_step"] = [round(step.wall_s, 2) for step in steps]
    time_uses = [poll.time_use for poll in polls if poll.time_use is not None]
    if time_uses:
        result.extra["time_use"] = time_uses[-1].model_dump()
    if analyse is not None:
        result.extra |= analyse(run, steps, polls, pipeline)
    return result


def summarize(
    cell: Cell,
    run_id: str,
    steps: list[StepRecord],
    evals: list[EvalRecord],
    report: RunReport,
    polls: list[DashboardResponse],
) -> CellResult:
    rewards = [step.reward_mean for step in steps]
    lags: dict[str, int] = {}
    for step in steps:
        for lag, count in step.staleness_histogram.items():
            lags[lag] = lags.get(lag, 0) + count
    wall_s = steps[-1].wall_s if steps else 0.0
    train_s = sum(step.train_s for step in steps)
    last_dropped = steps[-1].num_dropped if steps else {}
    predicted = [p.capacity.predicted_utilization for p in polls if p.capacity.predicted_utilization is not None]
    rates = [w.samples_per_s for p in polls for w in p.workers if w.samples_per_s > 0]
    return CellResult(
        key=cell.key,
        cell=asdict(cell),
        run_id=run_id,
        num_steps=len(steps),
        final_reward=statistics.fmean(rewards[-TRAILING_STEPS:]) if rewards else 0.0,
        eval_accuracy_final=evals[-1].eval_accuracy if evals else None,
        eval_curve=[(record.eval_step, record.eval_accuracy) for record in evals],
        steps_to_target=steps_to_reach(rewards, REWARD_TARGET),
        reward_curve=rewards,
        lag_histogram=dict(sorted(lags.items(), key=lambda item: int(item[0]))),
        num_dropped=dict(last_dropped),
        wall_s=wall_s,
        busy_fraction=train_s / wall_s if wall_s else 0.0,
        steps_per_hour=3600.0 * len(steps) / wall_s if wall_s else 0.0,
        is_weight_mean=statistics.fmean(step.is_weight_mean for step in steps) if steps else None,
        truncated_fraction=statistics.fmean(step.truncated_fraction for step in steps) if steps else 0.0,
        cost_usd=report.cost_usd,
        predicted_utilization=statistics.median(predicted) if predicted else None,
        cost_curve=[(p.learner.learner_version, p.cost.total_usd) for p in polls if p.learner is not None],
        worker_samples_per_s=statistics.fmean(rates) if rates else None,
        train_s_per_step=train_s / len(steps) if steps else 0.0,
    )


def steps_to_reach(rewards: list[float], target: float, window: int = TRAILING_STEPS) -> int | None:
    """The first step (1-based) whose mean reward over the last `window` steps is at least `target`."""
    for end in range(window, len(rewards) + 1):
        if statistics.fmean(rewards[end - window : end]) >= target:
            return end
    return None


def save(result: CellResult, out_dir: Path) -> Path:
    path = out_dir / "cells" / f"{result.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=1))
    return path


def load_results(out_dir: Path) -> list[CellResult]:
    return [CellResult(**json.loads(path.read_text())) for path in sorted((out_dir / "cells").glob("*.json"))]


def start_runner_logging() -> None:
    """Log lines with times; SIGTERM (and SIGINT, which a background job inherits ignored) raise
    KeyboardInterrupt, so the cell in flight stops its cluster by PID."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGINT, raise_keyboard_interrupt)
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)


def run_missing(cells: list[Cell], out_dir: Path, runs_dir: Path, analyse: CellAnalysis | None = None) -> None:
    """Run every cell without a result file in `out_dir/cells`, saving each as it finishes (resumable);
    a cell cut short before has its run folder removed and starts over."""
    todo = [cell for cell in cells if not (out_dir / "cells" / f"{cell.key}.json").exists()]
    log.info("%d cells, %d done before, %d to run", len(cells), len(cells) - len(todo), len(todo))
    for index, cell in enumerate(todo, 1):
        shutil.rmtree(runs_dir / f"{cell.run_id_prefix}-{cell.key}", ignore_errors=True)
        started_s = time.monotonic()
        result = run_cell(cell, runs_dir, analyse)
        save(result, out_dir)
        log.info(
            "cell %d/%d %s: final reward %.3f, held-out %s, busy %.2f, $%s, lags %s, %.0fs",
            index,
            len(todo),
            cell.key,
            result.final_reward,
            result.eval_accuracy_final,
            result.busy_fraction,
            f"{result.cost_curve[-1][1]:.4f}" if result.cost_curve else "-",
            result.lag_histogram,
            time.monotonic() - started_s,
        )
