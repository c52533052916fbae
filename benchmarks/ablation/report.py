"""The ablation's table and plots, from the cell files (benchmarks/results/ablation/cells/*.json).

table.md            one row per (mode, S, correction): mean and spread over seeds
summary.json        the same rows as numbers
reward_vs_step.png  reward (10-step moving mean, mean over seeds, min-max band) per S, one panel
                    per correction
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.ablation.cells import REWARD_TARGET, TRAILING_STEPS, CellResult, load_results


def row_key(result: CellResult) -> tuple[str, int, str, str]:
    cell = result.cell
    return (cell["mode"], cell["staleness_bound"], cell["correction"], cell.get("tag", ""))


def summarize_rows(results: list[CellResult]) -> list[dict[str, Any]]:
    by_row: dict[tuple[str, int, str, str], list[CellResult]] = defaultdict(list)
    for result in results:
        by_row[row_key(result)].append(result)
    rows = []
    for (mode, bound, correction, tag), group in sorted(
        by_row.items(), key=lambda item: (item[0][0] != "pull", item[0][1:])
    ):
        lags: dict[str, int] = defaultdict(int)
        for result in group:
            for lag, count in result.lag_histogram.items():
                lags[lag] += count
        total = sum(lags.values()) or 1
        reached = [r.steps_to_target for r in group if r.steps_to_target is not None]
        evals = [r.eval_accuracy_final for r in group if r.eval_accuracy_final is not None]
        rows.append(
            {
                "mode": mode,
                "staleness_bound": bound,
                "correction": correction if bound > 0 or mode == "pull" else "(either: lag 0)",
                "tag": tag,
                "seeds": sorted(r.cell["seed"] for r in group),
                "final_reward": _spread([r.final_reward for r in group]),
                "eval_accuracy": _spread(evals),
                "steps_to_target": _spread([float(s) for s in reached]),
                "num_reached_target": len(reached),
                "lag_fractions": {lag: count / total for lag, count in sorted(lags.items(), key=lambda i: int(i[0]))},
                "dropped_stale_per_trained": statistics.fmean(
                    r.num_dropped.get("stale", 0) / max(sum(r.lag_histogram.values()), 1) for r in group
                ),
                "busy_fraction": _spread([r.busy_fraction for r in group]),
                "steps_per_hour": _spread([r.steps_per_hour for r in group]),
                "wall_s": _spread([r.wall_s for r in group]),
                "predicted_utilization": _spread(
                    [r.predicted_utilization for r in group if r.predicted_utilization is not None]
                ),
                "cost_usd": _spread([r.cost_usd for r in group if r.cost_usd is not None]),
            }
        )
    return rows


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}


def _fmt(spread: dict[str, float] | None, digits: int = 2) -> str:
    if spread is None:
        return "-"
    if spread["n"] == 1:
        return f"{spread['mean']:.{digits}f}"
    return f"{spread['mean']:.{digits}f} [{spread['min']:.{digits}f}, {spread['max']:.{digits}f}]"


def table(rows: list[dict[str, Any]]) -> str:
    header = (
        "| mode | S | correction | seeds | final reward | held-out accuracy | steps to 0.8 (reached) "
        "| trained lags (share) | stale drops / trained | busy | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    for row in rows:
        lags = " ".join(f"{lag}:{share:.2f}" for lag, share in row["lag_fractions"].items())
        lines.append(
            f"| {row['mode']}{' ' + row['tag'] if row['tag'] else ''} | {row['staleness_bound']} | {row['correction']} "
            f"| {len(row['seeds'])} | {_fmt(row['final_reward'])} | {_fmt(row['eval_accuracy'])} "
            f"| {_fmt(row['steps_to_target'], 0)} ({row['num_reached_target']}/{len(row['seeds'])}) | {lags} "
            f"| {row['dropped_stale_per_trained']:.2f} | {_fmt(row['busy_fraction'])} | {_fmt(row['wall_s'], 0)} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: list[CellResult], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    corrections = ["truncated_is", "none"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for axis, correction in zip(axes, corrections, strict=True):
        curves: dict[str, list[np.ndarray]] = defaultdict(list)
        for result in results:
            cell = result.cell
            if cell.get("tag"):
                continue
            if cell["mode"] == "pull":
                label = "pull (sync)"
            elif cell["staleness_bound"] == 0 or cell["correction"] == correction:
                label = f"S={cell['staleness_bound']}"
            else:
                continue
            rewards = np.asarray(result.reward_curve)
            kernel = np.ones(TRAILING_STEPS) / TRAILING_STEPS
            curves[label].append(np.convolve(rewards, kernel, mode="valid"))
        for label in sorted(
            curves, key=lambda name: (not name.startswith("S"), int(name[2:]) if name.startswith("S") else 0)
        ):
            length = min(len(curve) for curve in curves[label])
            stacked = np.stack([curve[:length] for curve in curves[label]])
            steps = np.arange(TRAILING_STEPS, TRAILING_STEPS + length)
            line = axis.plot(steps, stacked.mean(axis=0), label=f"{label} (n={len(stacked)})")[0]
            axis.fill_between(steps, stacked.min(axis=0), stacked.max(axis=0), color=line.get_color(), alpha=0.12)
        axis.axhline(REWARD_TARGET, color="grey", linestyle=":", linewidth=1)
        axis.set_title(f"correction: {correction}")
        axis.set_xlabel("learner step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    axes[0].set_ylabel(f"reward ({TRAILING_STEPS}-step mean; mean over seeds, min-max band)")
    fig.suptitle("staleness ablation: demo task (a+b mod 10), tiny Qwen2 on CPU, equal learner steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out_dir: Path) -> str:
    results = load_results(out_dir)
    if not results:
        return f"no cells in {out_dir / 'cells'} yet"
    rows = summarize_rows(results)
    text = table(rows)
    (out_dir / "table.md").write_text(text)
    (out_dir / "summary.json").write_text(json.dumps(rows, indent=1))
    plot(results, out_dir / "reward_vs_step.png")
    return text
