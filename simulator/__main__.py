"""python -m simulator: discrete-event simulation of heterogeneous WAN rollout fleets (10 to 5,000 workers)
against a centralized baseline, with the coordinator's own capacity model and activation code.

    python -m simulator                                    # 10, 100, 1000, 5000 workers -> cost table
    python -m simulator --workers 200 --payload-gb 15.2    # full bf16 weights instead of LoRA adapters
    make simulate                                          # the default sweep, written to benchmarks/results/

Every assumption (prices, throughputs, bandwidths, failures, the workload) is in simulator/fleet.py and
simulator/cost.py and is copied into the JSON it writes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from simulator import cost, fleet
from simulator.cost import Scenario, compare

REPO_ROOT = Path(__file__).resolve().parent.parent


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| workers | learner H100s | samples/s needed | active (mean) | T_bcast s | util. decentral. | util. central. "
        "| $/step decentral. | $/step central. (H100 rollouts) | cost ratio | rollout cost ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, c = r["decentralized"], r["centralized"]
        lines.append(
            f"| {r['num_workers']} | {r['learner_h100s']} | {r['required_samples_per_s']:.1f} | {d['mean_active_workers']:.0f} "
            f"| {d['mean_broadcast_s']:.0f} | {d['learner_utilization']:.3f} | {c['learner_utilization']:.3f} "
            f"| {d['usd_per_step']:.3f} | {c['usd_per_step']:.3f} ({c['rollout_h100s']}) | {r['cost_ratio']:.2f} "
            f"| {r['rollout_cost_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m simulator", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[10, 100, 1000, 5000], help="fleet sizes (10 to 5000)"
    )
    parser.add_argument("--steps", type=int, default=30, help="learner steps per simulated run")
    parser.add_argument(
        "--payload-gb", type=float, default=0.32, help="bytes broadcast per version (0.32: LoRA r=64; 15.2: bf16 7B)"
    )
    parser.add_argument("--staleness-bound", type=int, default=4, help="S")
    parser.add_argument("--publish-every", type=int, default=1, help="k")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the rows and assumptions as JSON here")
    args = parser.parse_args(argv)
    if any(n < 1 or n > 5000 for n in args.workers):
        parser.error("--workers takes fleet sizes from 1 to 5000")

    rows = []
    for num_workers in args.workers:
        started = time.monotonic()
        row = compare(
            Scenario(
                num_workers=num_workers,
                num_steps=args.steps,
                payload_gb=args.payload_gb,
                staleness_bound=args.staleness_bound,
                publish_every=args.publish_every,
                seed=args.seed,
            )
        )
        rows.append(row)
        print(
            f"{num_workers} workers: cost ratio {row['cost_ratio']:.2f}, utilization "
            f"{row['decentralized']['learner_utilization']:.3f} vs {row['centralized']['learner_utilization']:.3f}"
            f" ({time.monotonic() - started:.1f}s)",
            flush=True,
        )
    table = markdown_table(rows)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d", time.gmtime()),
                    "command": " ".join(["python -m simulator", *(sys.argv[1:] if argv is None else argv)]),
                    "assumptions": {"fleet": fleet.__doc__, "workload_and_baseline": cost.__doc__},
                    "table_markdown": table,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
