"""Trust score: detection delay per liar kind and false positives over full demo runs (docs/trust.md).

    python -m benchmarks.trust                       # or: make bench-trust (~30 min on 2 cores)
    python -m benchmarks.trust --kinds stale_weights --honest-runs 0

Each run is the demo (configs/demo.toml, max_wall_s included) as `make demo` runs it, through the same local
cluster runner (cluster/local.py):
- one run per liar kind: 3 honest workers + 1 liar (benchmarks/liar_worker.py liar_entry_points: the lies of
  benchmarks/liars.py);
- `--honest-runs` runs of the demo's 3 honest workers only.
The machine's two cores are shared by the learner, the reward service, the coordinator, Redis and every worker
(and whatever else runs): the runs are CPU-contended by construction; `--busy-loops N` adds N spinning processes.

Per liar: groups of the liar the learner trained on until its trust score crossed the threshold (counted from
its first group, and from its first lying group: for stale_weights the first claiming a version past the
freeze), the groups trained after that before the quarantine reached the learner, and the groups dropped as
`quarantined`. Per run: honest workers quarantined (false positives) and the highest honest score. Plus the
spot audits' cost. Writes benchmarks/results/trust.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import re
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.liar_worker import liar_entry_points
from benchmarks.liars import DEFAULT_STALE_AFTER_VERSION, FaultKind
from cluster.local import REPO_ROOT, ClusterOptions, LocalCluster
from shared.config import load_run_config
from shared.run_records import GroupTrustRecord, LearnerSummary, read_metrics, read_trust_records

log = logging.getLogger("benchmarks.trust")

LIAR_NAME = "worker-3"


def spin() -> None:
    while True:
        pass


def run_one(
    config_path: Path,
    runs_dir: Path,
    run_id: str,
    num_workers: int,
    liars: dict[str, str],
    model_dir: Path | None = None,
) -> LocalCluster:
    cluster = LocalCluster(
        ClusterOptions(
            config_path=config_path,
            num_workers=num_workers,
            runs_dir=runs_dir,
            run_id=run_id,
            worker_entry_points=liar_entry_points(liars),
            model_dir=model_dir,
        )
    )
    try:
        cluster.start()
        cluster.wait_until_done()
    except TimeoutError as exc:  # a contended machine: what the run did until then still counts
        log.warning("%s: %s; stopping it and summarising what it did", run_id, exc)
    finally:
        cluster.stop()
    return cluster


def worker_ids(run_dir: Path) -> dict[str, str]:
    """Service name -> the id the coordinator gave it (every registration, from the worker logs)."""
    ids: dict[str, str] = {}
    for path in sorted((run_dir / "logs").glob("worker-*.log")):
        for match in re.finditer(r"registered as (\S+)", path.read_text()):
            ids[match.group(1)] = path.stem
    return ids


def quarantined_ids(run_dir: Path) -> list[str]:
    """Workers the coordinator quarantined, in order (its log)."""
    text = (run_dir / "logs" / "coordinator.log").read_text()
    return re.findall(r"quarantined worker (\S+):", text)


def liar_detection(records: list[GroupTrustRecord], liar_ids: set[str], threshold: float, kind: str) -> dict[str, Any]:
    mine = [r for r in records if r.worker_id in liar_ids]
    crossed = next((i for i, r in enumerate(mine) if r.score >= threshold), None)
    lying_from = 0
    if kind == FaultKind.STALE_WEIGHTS:  # its groups up to the freeze are honest
        lying_from = next((i for i, r in enumerate(mine) if r.policy_version > DEFAULT_STALE_AFTER_VERSION), len(mine))
    return {
        "num_groups_trained": len(mine),
        "groups_until_suspect": None if crossed is None else crossed + 1,
        "lying_groups_until_suspect": None if crossed is None else crossed + 1 - lying_from,
        "groups_trained_after_suspect": None if crossed is None else len(mine) - crossed - 1,
        "suspect_at_step": None if crossed is None else mine[crossed].step,
        "num_audits": sum(r.exact_diff_nats is not None for r in mine[: (crossed or len(mine)) + 1]),
        "num_audit_failures": sum(r.audit_failed for r in mine[: (crossed or len(mine)) + 1]),
        "num_suspicious": sum(r.suspicious for r in mine[: (crossed or len(mine)) + 1]),
    }


def summarize_run(run_dir: Path, kind: str | None, threshold: float, wall_s: float) -> dict[str, Any]:
    ids = worker_ids(run_dir)
    liar_ids = {wid for wid, name in ids.items() if kind is not None and name == LIAR_NAME}
    honest_ids = set(ids) - liar_ids
    records = read_trust_records(run_dir / "trust.jsonl")
    quarantined = quarantined_ids(run_dir)
    steps, _ = read_metrics(run_dir / "metrics.jsonl")
    summary_path = run_dir / "learner_summary.json"  # written when the learner stops, by a signal too
    summary = LearnerSummary.model_validate_json(summary_path.read_text())
    honest_scores = [r.score for r in records if r.worker_id in honest_ids]
    audits = [r.audit_s for r in records if r.audit_s > 0]
    honest_exact = sorted(r.exact_diff_nats for r in records if r.worker_id in honest_ids and r.exact_diff_nats)
    tolerances = [r.tolerance_nats for r in records]
    result: dict[str, Any] = {
        "run_dir": str(run_dir.relative_to(REPO_ROOT) if run_dir.is_relative_to(REPO_ROOT) else run_dir),
        "liar_kind": kind,
        "num_honest_workers": len({ids[w] for w in honest_ids}),
        "num_steps": summary.num_steps,
        "finished": summary.finished,
        "wall_s": round(wall_s, 1),
        "reward_mean_first": summary.reward_mean_first,
        "reward_mean_last": summary.reward_mean_last,
        "eval_accuracy_before": summary.eval_accuracy_before,
        "eval_accuracy_after": summary.eval_accuracy_after,
        "num_groups_checked": len(records),
        "num_dropped": summary.num_dropped,
        "quarantined_dropped": steps[-1].num_dropped.get("quarantined", 0) if steps else 0,
        "false_positives": sorted(ids[w] for w in set(quarantined) & honest_ids),
        "num_false_positives": len(set(quarantined) & honest_ids),
        "honest_max_score": max(honest_scores, default=0.0),
        "honest_num_suspicious_groups": sum(r.suspicious for r in records if r.worker_id in honest_ids),
        "honest_num_audit_failures": sum(r.audit_failed for r in records if r.worker_id in honest_ids),
        "num_exact_checks": sum(r.exact_diff_nats is not None for r in records),
        "honest_suspected": sorted(
            {ids[r.worker_id] for r in records if r.worker_id in honest_ids and r.score >= threshold}
        ),
        "honest_exact_diff_nats": quantiles(honest_exact),
        "tolerance_nats": {"min": min(tolerances, default=None), "max": max(tolerances, default=None)},
        "num_spot_audits": len(audits),
        "audit_ms_per_group_mean": round(1e3 * statistics.fmean(audits), 3) if audits else None,
        "train_s_per_step": summary.train_s_per_step,
    }
    if kind is not None:
        result["liar_quarantined"] = bool(liar_ids & set(quarantined))
        result["liar"] = liar_detection(records, liar_ids, threshold, kind)
    return result


def quantiles(values: list[float]) -> dict[str, float | int | None]:
    """count, median, p99 and max of sorted values (None where there are none)."""
    if not values:
        return {"count": 0, "median": None, "p99": None, "max": None}
    return {
        "count": len(values),
        "median": round(values[len(values) // 2], 5),
        "p99": round(values[min(len(values) - 1, int(0.99 * len(values)))], 5),
        "max": round(values[-1], 5),
    }


def with_staleness(config_path: Path, staleness_bound: int, out_dir: Path) -> Path:
    """A copy of the run file with `[schedule] staleness_bound` set (the rest as it is)."""
    text = config_path.read_text()
    if not re.search(r"^staleness_bound\s*=", text, flags=re.MULTILINE):
        raise ValueError(f"{config_path} sets no staleness_bound to override")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{config_path.stem}-s{staleness_bound}.toml"
    path.write_text(
        re.sub(r"^staleness_bound\s*=\s*\d+", f"staleness_bound = {staleness_bound}", text, flags=re.MULTILINE)
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trust", description=__doc__)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "demo.toml")
    parser.add_argument(
        "--kinds", nargs="*", default=[k.value for k in FaultKind], choices=[k.value for k in FaultKind]
    )
    parser.add_argument("--honest-runs", type=int, default=3, help="runs with the demo's 3 honest workers only")
    parser.add_argument(
        "--staleness",
        type=int,
        nargs="*",
        default=[],
        help="one honest run per staleness bound (the run file's staleness_bound replaced), after the others",
    )
    parser.add_argument("--workers", type=int, default=3, help="workers of an honest run (a liar run: 3 honest + 1)")
    parser.add_argument("--model-dir", type=Path, default=None, help="the policy folder (default: the run file's)")
    parser.add_argument("--busy-loops", type=int, default=0, help="extra spinning processes (CPU contention)")
    parser.add_argument("--runs-dir", type=Path, default=REPO_ROOT / "runs")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "trust.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    threshold = load_run_config(args.config).trust.quarantine_score
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy_loops)]
    for spinner in spinners:
        spinner.start()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    configs_dir = args.runs_dir / f"trust-configs-{stamp}"
    plan: list[tuple[str | None, int, Path]] = [(kind, 4, args.config) for kind in args.kinds]
    plan += [(None, args.workers, args.config)] * args.honest_runs
    plan += [(None, args.workers, with_staleness(args.config, bound, configs_dir)) for bound in args.staleness]
    runs = []
    try:
        for index, (kind, num_workers, config_path) in enumerate(plan):
            run_id = f"trust-{kind or 'honest'}-{index}-{stamp}"
            log.info("run %d/%d: %s (%s)", index + 1, len(plan), run_id, config_path.name)
            started_s = time.monotonic()
            liars = {LIAR_NAME: kind} if kind else {}
            cluster = run_one(config_path, args.runs_dir, run_id, num_workers, liars, args.model_dir)
            runs.append(summarize_run(cluster.run_dir, kind, threshold, time.monotonic() - started_s))
            runs[-1]["staleness_bound"] = load_run_config(config_path).schedule.staleness_bound
            log.info("%s", json.dumps(runs[-1]))
            write_results(args, threshold, runs)  # after every run: a long bench keeps what it measured
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    result = write_results(args, threshold, runs)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


def write_results(args: argparse.Namespace, threshold: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    result = {
        "command": "python -m benchmarks.trust "
        + " ".join(f"--kinds {' '.join(args.kinds)}".split())
        + f" --honest-runs {args.honest_runs} --busy-loops {args.busy_loops} --workers {args.workers}"
        + (f" --staleness {' '.join(map(str, args.staleness))}" if args.staleness else "")
        + (f" --config {args.config} --model-dir {args.model_dir}" if args.model_dir else ""),
        "date": time.strftime("%Y-%m-%d"),
        "config": str(args.config.relative_to(REPO_ROOT) if args.config.is_relative_to(REPO_ROOT) else args.config),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_at_end": os.getloadavg()},
        "quarantine_score": threshold,
        "runs": runs,
        "num_false_positives_total": sum(r["num_false_positives"] for r in runs),
        "num_honest_suspected_total": sum(len(r["honest_suspected"]) for r in runs),
        "num_honest_worker_runs": sum(r["num_honest_workers"] for r in runs),
        "detection_groups_by_kind": {r["liar_kind"]: r["liar"]["groups_until_suspect"] for r in runs if r["liar_kind"]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
