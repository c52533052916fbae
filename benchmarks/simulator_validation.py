"""Real local runs vs the simulator: predicted and measured learner utilization (target: within 10%).

    python -m benchmarks.simulator_validation            # or: make simulator-validation

Runs the real local cluster (Redis, coordinator, reward, learner, N rollout workers as processes) for
each configuration below, polls the coordinator's /v1/dashboard while it runs, then feeds the measured
inputs (T_train, overhead, each worker's samples/s, T_bcast) into the simulator and the analytic capacity
model and compares their learner utilization with the measured one over the same steady window.
Writes benchmarks/results/simulator_validation.json.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.measured_cluster import run_cluster
from benchmarks.result_file import write_result
from simulator.validation import measure_run, predict

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "simulator_validation.json"
FAST = REPO_ROOT / "benchmarks" / "simulator_validation.toml"  # 2-token completions: the learner is the bottleneck
SLOW = REPO_ROOT / "benchmarks" / "simulator_validation_slow_workers.toml"  # 16-token completions: generation binds
# (name, run file, workers, run-file overrides)
RUNS = [
    ("fast-2-workers-S2", FAST, 2, {}),
    ("fast-3-workers-S2", FAST, 3, {}),
    ("fast-3-workers-S1", FAST, 3, {"staleness_bound": 1}),
    ("slow-1-worker-S2", SLOW, 1, {}),
    ("slow-2-workers-S2", SLOW, 2, {}),
]
WARMUP_STEPS = 10
REWARD_POLL_S = 0.05  # the reward service's read block (services/reward/service.py ROLLOUTS_BLOCK_MS)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.simulator_validation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="simval-") as tmp:
        for name, config, num_workers, overrides in RUNS:
            started = time.monotonic()
            steps, polls, pipeline, run = run_cluster(name, config, num_workers, overrides, Path(tmp))
            measured = measure_run(run, steps, polls, WARMUP_STEPS, pipeline)
            row = {
                "name": name,
                "config": str(config.relative_to(REPO_ROOT)),
                "workers": num_workers,
                **predict(run, measured, reward_poll_s=REWARD_POLL_S, max_groups_per_batch=16),
            }
            row["run_wall_s"] = round(time.monotonic() - started, 1)
            rows.append(row)
            print(
                f"{name}: measured {row['measured_utilization']:.3f} simulated {row['simulated_utilization']:.3f}"
                f" ({100 * row['simulator_relative_error']:+.1f}%) analytic {row['analytic_utilization']:.3f}"
                f" ({100 * row['analytic_relative_error']:+.1f}%)",
                flush=True,
            )
    result = {
        "command": "python -m benchmarks.simulator_validation",
        "machine": f"{platform.machine()}, {platform.system()}, 2 CPU cores shared by every service",
        "warmup_steps": WARMUP_STEPS,
        "target": "|simulated - measured| / measured <= 0.10",
        "all_within_10_percent": all(abs(r["simulator_relative_error"]) <= 0.10 for r in rows),
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
