"""The broadcast benchmark's table and plot from the raw per-receiver figures of benchmarks/broadcast/run.py.

floors        line rate: size * 8 / B; TCP goodput: that / 0.9564 (MTU 1500 headers, wan.py)
per N, mode   end to end = max over receivers of ready - publication start; transfer only = max of
              last chunk verified - announcement; both as seconds and ratios to the two floors;
              publication seconds; bytes the learner's uplink carried (and as copies of the
              version); CPU s per GiB received per receiver (mean, max); the machine's busy
              fraction; the engine's pause per swap
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

from cluster.wan.namespaces import GOODPUT_FRACTION
from shared.weight_channel import RELAY_PIECE_BYTES

GIB = float(1 << 30)
TARGET_RATIO = {16: 1.25, 4: 1.10, 1: 1.08}  # pipelined end to end / line-rate floor (issue 11)


def floors(size_bytes: int, mbps: float) -> tuple[float, float]:
    """(line-rate floor, TCP-goodput floor) in seconds for one copy through a `mbps` link."""
    line_s = size_bytes * 8 / (mbps * 1e6)
    return line_s, line_s / GOODPUT_FRACTION


def row(run: dict[str, Any], mbps: float) -> dict[str, Any]:
    """One mode at one N: the table's columns."""
    line_s, goodput_s = floors(run["total_size_bytes"], mbps)
    receivers = run["receivers"].values()
    end_to_end_s = max(r["end_to_end_s"] for r in receivers)
    transfer_s = max(r["transfer_only_s"] for r in receivers)
    cpu_per_gib = [r["cpu_s"] / max(1, r["num_bytes"]) * GIB for r in receivers]
    out = {
        "end_to_end_s": round(end_to_end_s, 3),
        "end_to_end_ratio_line": round(end_to_end_s / line_s, 3),
        "end_to_end_ratio_goodput": round(end_to_end_s / goodput_s, 3),
        "transfer_only_s": round(transfer_s, 3),
        "transfer_only_ratio_line": round(transfer_s / line_s, 3),
        "transfer_only_ratio_goodput": round(transfer_s / goodput_s, 3),
        "publish_s": round(run["publish_s"], 3),
        "announcement_read_s_max": round(max(r["announcement_read_s"] for r in receivers), 3),
        "ready_after_transfer_s_max": round(max(r["ready_after_transfer_s"] for r in receivers), 3),
        "learner_wire_bytes": run["learner_wire_bytes"],
        # the veth counter counts a GSO super-packet's headers once: ~payload + HTTP, hence per payload byte
        "learner_copies": round(run["learner_wire_bytes"] / run["total_size_bytes"], 3),
        "num_receivers_served_by_learner": sum(r["from_learner"] for r in receivers),
        "cpu_s_per_gib_mean": round(mean(cpu_per_gib), 2),
        "cpu_s_per_gib_max": round(max(cpu_per_gib), 2),
        "learner_cpu_s": round(run["learner_cpu_s"], 2),
        "machine_busy_fraction": round(run["machine_busy_fraction"], 3),
        "machine_softirq_fraction": round(run["machine_softirq_fraction"], 3),
        # the benchmark's own processes over the same window: the rest of busy is softirq and other tenants
        "nodes_busy_fraction": round(
            (sum(r["cpu_s"] for r in receivers) + run["learner_cpu_s"]) / (run["cpu_count"] * end_to_end_s), 3
        ),
        "pause_s": {name: round(s, 3) for name, s in run["pause_s"].items()},
    }
    target = TARGET_RATIO.get(run["num_receivers"])
    if run["mode"] == "pipelined" and target is not None:
        out["target_ratio_line"] = target
        out["meets_target"] = end_to_end_s / line_s <= target
    return out


def summarize(runs: list[dict], extras: dict[str, Any], mbps: float, chunk_size_bytes: int) -> dict[str, Any]:
    size_bytes = runs[0]["total_size_bytes"]
    line_s, goodput_s = floors(size_bytes, mbps)
    table: dict[str, dict[str, Any]] = {}
    for run in runs:
        entry = table.setdefault(str(run["num_receivers"]), {})
        entry[run["mode"]] = row(run, mbps)
    out: dict[str, Any] = {
        "total_size_bytes": size_bytes,
        "line_floor_s": round(line_s, 3),
        "goodput_floor_s": round(goodput_s, 3),
        "table": table,
        "cpu_limit": cpu_limit(runs, mbps, chunk_size_bytes),
        "runs": runs,
    }
    for name, run in extras.items():
        out[name] = {
            **run,
            "row": row(run, min(mbps, *run.get("link_mbps", {}).values()) if "link_mbps" in run else mbps),
        }
    return out


def cpu_limit(runs: list[dict], mbps: float, chunk_size_bytes: int) -> dict[str, Any]:
    """Is this 2-core machine the limit at the largest N? What the receivers' CPU adds up to, and a model
    of a receiver on its own machine: the smallest N's end to end plus one hop time per extra hop (a
    relay forwards cut-through: a hop costs one piece of RELAY_PIECE_BYTES, or the chunk if smaller)."""
    pipelined = {run["num_receivers"]: run for run in runs if run["mode"] == "pipelined"}
    largest, smallest = pipelined[max(pipelined)], pipelined[min(pipelined)]
    line_s, _ = floors(largest["total_size_bytes"], mbps)
    receivers = largest["receivers"].values()
    end_to_end_s = max(r["end_to_end_s"] for r in receivers)
    receivers_cpu_s = sum(r["cpu_s"] for r in receivers)
    chunk_s = chunk_size_bytes * 8 / (mbps * GOODPUT_FRACTION * 1e6)
    hop_s = min(chunk_size_bytes, RELAY_PIECE_BYTES) * 8 / (mbps * GOODPUT_FRACTION * 1e6)
    own_machine_s = (
        max(r["end_to_end_s"] for r in smallest["receivers"].values())
        + (largest["num_receivers"] - smallest["num_receivers"]) * hop_s
    )
    return {
        "num_receivers": largest["num_receivers"],
        "machine_busy_fraction": round(largest["machine_busy_fraction"], 3),
        "machine_softirq_fraction": round(largest["machine_softirq_fraction"], 3),
        "receivers_cpu_s": round(receivers_cpu_s, 2),
        "learner_cpu_s": round(largest["learner_cpu_s"], 2),
        "cores_used_mean": round((receivers_cpu_s + largest["learner_cpu_s"]) / end_to_end_s, 2),
        "core_fraction_one_receiver_needs": round(mean(r["cpu_s"] for r in receivers) / line_s, 3),
        # to finish at the line-rate floor, the receivers alone would need this many cores (softirq on top)
        "receivers_cores_needed_at_line_rate": round(receivers_cpu_s / line_s, 2),
        "chunk_time_s": round(chunk_s, 4),
        "hop_time_s": round(hop_s, 4),
        "own_machine_estimate_s": round(own_machine_s, 3),
        "own_machine_estimate_ratio_line": round(own_machine_s / line_s, 3),
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    ns = sorted(int(n) for n in results["table"])
    for mode, style in (("one_to_many", "o-"), ("pipelined", "s-")):
        label = mode.replace("_", "-")
        if all(mode in results["table"][str(n)] for n in ns):
            times = [results["table"][str(n)][mode]["end_to_end_s"] for n in ns]
            left.plot(ns, times, style, label=f"{label}, end to end")
    left.plot(
        ns,
        [results["table"][str(n)]["pipelined"]["transfer_only_s"] for n in ns],
        "s:",
        label="pipelined, transfer only",
    )
    left.axhline(results["line_floor_s"], color="k", linestyle="--", label="floor: size / line rate")
    left.axhline(results["goodput_floor_s"], color="grey", linestyle=":", label="floor: size / TCP goodput")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="receivers N",
        ylabel="seconds to the last receiver",
        title=f"{results['payload_bytes'] >> 20} MiB bf16, every link {results['link_mbps']:g} Mbit/s, MTU 1500",
    )
    left.set_xticks(ns, [str(n) for n in ns])
    left.yaxis.set_major_formatter(ScalarFormatter())
    left.legend(fontsize=8)
    largest = [r for r in results["runs"] if r["mode"] == "pipelined"][-1]
    chain = list(largest["receivers"].values())
    depth = range(1, len(chain) + 1)
    right.plot(depth, [r["end_to_end_s"] for r in chain], "s", label=f"N = {len(chain)} pipelined, end to end")
    right.plot(depth, [r["transfer_only_s"] for r in chain], ".", label="transfer only")
    for name, style in (("heterogeneous", "x"), ("parent_killed", "^")):
        if name in results:
            times = sorted(r["end_to_end_s"] for r in results[name]["receivers"].values())
            right.plot(range(1, len(times) + 1), times, style, label=f"{name.replace('_', ' ')} (sorted)")
    right.axhline(results["line_floor_s"], color="k", linestyle="--", label="floor: size / line rate")
    right.set(
        xlabel="receiver, by chain depth", ylabel="seconds", title="per receiver (transfer only: from the announcement)"
    )
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
