"""The chunk-size x receive-mode matrix of the broadcast benchmark at N = 16, from its cells.

Each cell is one run of the benchmark (docs/broadcast_benchmark.md):

    python -m benchmarks.broadcast --num-receivers 16 --modes pipelined --no-extras --nice -10 \\
        --chunk-size-bytes <524288 | 16777216> --receive-into <memory | file> \\
        --out benchmarks/results/broadcast_cells --name n16_<512k | 16m>_<memory | file>_<round>

This reads every cell's JSON in a folder and writes one summary, every run of every cell (no run is
left out): `python -m benchmarks.broadcast.matrix benchmarks/results/broadcast_cells` ->
benchmarks/results/broadcast_matrix.json, and prints the table as markdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.broadcast.run import RESULTS_DIR
from benchmarks.result_file import write_result


def cell_row(path: Path) -> dict[str, Any]:
    """One run of one cell: the N = 16 pipelined row plus what says how busy the machine was."""
    results = json.loads(path.read_text())
    row = results["table"]["16"]["pipelined"]
    receivers = list(results["runs"][0]["receivers"].values())  # in chain order
    first_s, last_s = receivers[0]["end_to_end_s"], receivers[-1]["end_to_end_s"]
    return {
        "file": path.name,
        "date": results["date"],
        "chunk_size_bytes": results["chunk_size_bytes"],
        "receive_into": results["receive_into"],
        "node_niceness": results.get("node_niceness", 0),
        "end_to_end_s": row["end_to_end_s"],
        "end_to_end_ratio_line": row["end_to_end_ratio_line"],
        "meets_target": row["meets_target"],
        "depth_1_end_to_end_s": round(first_s, 3),
        "depth_1_ratio_line": round(first_s / results["line_floor_s"], 3),
        "relay_s_per_hop": round((last_s - first_s) / (len(receivers) - 1), 3),
        "publish_s": row["publish_s"],
        "cpu_s_per_gib_mean": row["cpu_s_per_gib_mean"],
        "machine_busy_fraction": row["machine_busy_fraction"],
        "nodes_busy_fraction": row["nodes_busy_fraction"],
        "num_receivers_served_by_learner": row["num_receivers_served_by_learner"],
        "num_bytes_max": max(r["num_bytes"] for r in receivers),  # > the version: someone refetched
        "total_size_bytes": results["total_size_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.broadcast.matrix", description=__doc__)
    parser.add_argument("cells", type=Path, help="folder of cell JSONs")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "broadcast_matrix.json")
    args = parser.parse_args()
    rows = sorted(
        (cell_row(path) for path in args.cells.glob("*.json")),
        key=lambda r: (r["chunk_size_bytes"], r["receive_into"], r["date"]),
    )
    write_result(args.out, {"num_receivers": 16, "mode": "pipelined", "runs": rows})
    print(
        "| chunk | receive into | ended (UTC) | nice | end to end | / line floor | depth 1 / line | per hop "
        "| publish | CPU s/GiB | machine busy |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        chunk = (
            f"{r['chunk_size_bytes'] >> 10} KiB"
            if r["chunk_size_bytes"] < 1 << 20
            else f"{r['chunk_size_bytes'] >> 20} MiB"
        )
        print(
            f"| {chunk} | {r['receive_into']} | {r['date'][11:16]} | {r['node_niceness']} | {r['end_to_end_s']:.2f} s | "
            f"{r['end_to_end_ratio_line']:.3f} | {r['depth_1_ratio_line']:.3f} | {1000 * r['relay_s_per_hop']:.0f} ms | "
            f"{r['publish_s']:.2f} s | {r['cpu_s_per_gib_mean']:.2f} | {r['machine_busy_fraction']:.2f} |"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
