"""make bench-broadcast: one-to-many vs pipelined relay vs the size / B floor, over capped links.

Real processes on an emulated WAN (benchmarks/broadcast/wan.py: a network namespace per node, `tc tbf`
on both directions of every link): one learner-side chunk server and up to 16 receiving chunk
servers running the rollout worker's relay code (benchmarks/broadcast/node.py), no model.

    calibrate      raw TCP through one capped link: the cap is the goodput (within 1%)
    for N in 1, 2, 4, 8, 16:
        one-to-many    every receiver streams the whole payload from the learner
        pipelined      the coordinator's plan (shared/relay_plan.py: one seed, a chain ranked by
                       bandwidth); each receiver streams from its parent while the parent receives
    heterogeneous  16 receivers at 400/200/100 Mbit/s: the plan ranked by bandwidth vs a chain in
                   registration order (each worker's own floor is size / min(B_learner, its link))
    parent killed  N = 16 pipelined, the receiver at depth 4 SIGKILLed 40% into the broadcast: its
                   child fails over to its grandparent and every other receiver still completes

Writes benchmarks/results/broadcast.json and broadcast.png. Needs root (namespaces); about 8 minutes
on 2 cores. The sizes are chosen for that: a 2-core machine moves ~400 MB/s of verified (sha256)
relay traffic at most, which 16 receivers at 200 Mbit/s (25 MB/s each) stay well under.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.broadcast.wan import Link, Wan, calibrate
from shared.relay_plan import RelayCandidate, plan_relay

log = logging.getLogger("bench-broadcast")

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
NUM_WORKERS = (1, 2, 4, 8, 16)
HETEROGENEOUS_MBPS = (400, 100, 200, 200)  # repeated over 16 workers in registration order
EVENT_TIMEOUT_S = 300.0


@dataclass
class Node:
    """One benchmark process in its namespace; its stdout lines are JSON events, read by a thread."""

    name: str
    popen: subprocess.Popen
    url: str = ""
    events: queue.Queue = field(default_factory=queue.Queue)

    def start_reader(self) -> None:
        def read() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                self.events.put(json.loads(line))
            self.events.put({"event": "exited", "code": self.popen.wait()})

        threading.Thread(target=read, name=f"read-{self.name}", daemon=True).start()

    def send(self, command: dict) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(command) + "\n")
        self.popen.stdin.flush()

    def next_event(self, timeout_s: float = EVENT_TIMEOUT_S) -> dict:
        try:
            event = self.events.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no answer within {timeout_s}s") from None
        if event["event"] == "exited":
            raise RuntimeError(f"{self.name} exited with code {event['code']}")
        return event

    def stop(self) -> None:
        """Quit politely, then by PID."""
        if self.popen.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.popen.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.wan = Wan()
        self.nodes: dict[str, Node] = {}
        self.version = 0
        self.log_dir = Path(tempfile.mkdtemp(prefix="rlb-logs-"))
        self.workers = [f"w{i}" for i in range(max(NUM_WORKERS))]

    @property
    def floor_s(self) -> float:
        return self.args.size_bytes * 8 / (self.args.mbps * 1e6)

    # setup and teardown
    def start(self) -> list[dict]:
        Wan.check_available()
        Wan.remove_leftovers()
        self.wan.create_bridge()
        self.wan.add_node("l", Link(self.args.mbps, self.args.mbps))
        for name in self.workers:
            self.wan.add_node(name, Link(self.args.mbps, self.args.mbps))
        calibration = [calibrate(self.wan, "l", "w0", 64 << 20)]
        log.info("calibration: %s", calibration[0])
        self.start_node(
            "l",
            [
                "--role",
                "learner",
                "--size-bytes",
                str(self.args.size_bytes),
                "--chunk-size-bytes",
                str(self.args.chunk_size_bytes),
            ],
        )
        for name in self.workers:
            self.start_node(name, ["--role", "receiver"])
        for node in self.nodes.values():
            node.url = node.next_event(60.0)["url"]
        return calibration

    def start_node(self, name: str, role_args: list[str]) -> None:
        argv = [sys.executable, "-m", "benchmarks.broadcast.node", "--host", self.wan.address[name], *role_args]
        stderr = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (closed when the process exits)
        popen = subprocess.Popen(
            self.wan.command(name, argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.nodes[name] = node = Node(name, popen)
        node.start_reader()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.wan.remove()

    # one broadcast
    def broadcast(
        self,
        receivers: list[str],
        sources: dict[str, list[str]],
        *,
        kill: str | None = None,
        kill_after_s: float = 0.0,
        check_blob: bool = False,
    ) -> dict:
        """Publish a new version and have `receivers` fetch it from `sources` at the same instant.
        Returns per-receiver results and T = last finish - start."""
        self.version += 1
        learner = self.nodes["l"]
        learner.send({"cmd": "publish", "version": self.version})
        manifest = learner.next_event()["manifest"]
        start_at_s = time.time() + 0.5
        for name in receivers:
            self.nodes[name].send(
                {
                    "cmd": "fetch",
                    "manifest": manifest,
                    "sources": sources[name],
                    "start_at": start_at_s,
                    "check_blob": check_blob,
                }
            )
        killer = None
        if kill is not None:
            killer = threading.Timer(
                start_at_s + kill_after_s - time.time(), os.kill, (self.nodes[kill].popen.pid, signal.SIGKILL)
            )
            killer.start()
        results = {}
        for name in receivers:
            if name == kill:
                continue
            event = self.nodes[name].next_event()
            if event["event"] != "done":
                raise RuntimeError(f"{name} failed: {event}")
            results[name] = event
        if killer is not None:
            killer.join()
            self.nodes[kill].popen.wait(timeout=10)
        finished = [r["finished_at_s"] - start_at_s for r in results.values()]
        learner_url = learner.url
        return {
            "seconds": round(max(finished), 3),
            "per_worker_s": {name: round(r["finished_at_s"] - start_at_s, 3) for name, r in results.items()},
            "bytes": sum(r["num_bytes"] for r in results.values()),
            "learner_bytes": sum(r["bytes_by_source"].get(learner_url, 0) for r in results.values()),
            "num_corrupt_chunks": sum(r["num_corrupt_chunks"] for r in results.values()),
            "failures": {name: r["failures"] for name, r in results.items() if r["failures"]},
            "blob_ok": all(r["blob_ok"] for r in results.values()) if check_blob else None,
        }

    # sources per mode
    def one_to_many(self, receivers: list[str]) -> dict[str, list[str]]:
        return {name: [self.nodes["l"].url] for name in receivers}

    def planned(self, receivers: list[str], ranked: bool = True) -> dict[str, list[str]]:
        """Sources per receiver from the coordinator's rule (shared/relay_plan.py) on their link speeds:
        parent, fallbacks, the learner. Unranked: every worker reports the same speed, so the chain
        follows registration order (ties are broken by id, and these ids sort that way)."""
        names = {f"{index:03d}": name for index, name in enumerate(receivers)}
        candidates = [
            RelayCandidate(worker_id, self.nodes[name].url, self.wan.links[name].down_mbps if ranked else 1.0)
            for worker_id, name in names.items()
        ]
        learner_url = self.nodes["l"].url
        return {
            names[a.worker_id]: [a.parent_url or learner_url, *a.fallback_urls, learner_url]
            for a in plan_relay(candidates, num_seeds=1, fanout=1).assignments.values()
        }

    def depth_order(self, sources: dict[str, list[str]]) -> list[str]:
        """Receivers of a single chain, from the seed down."""
        name_of = {node.url: name for name, node in self.nodes.items()}
        child_of = {name_of[urls[0]]: name for name, urls in sources.items()}
        order, node = [], "l"
        while node in child_of:
            node = child_of[node]
            order.append(node)
        return order

    # the benchmark
    def sweep(self) -> list[dict]:
        runs = []
        for num_workers in NUM_WORKERS:
            receivers = self.workers[:num_workers]
            for mode, sources in (("one_to_many", self.one_to_many(receivers)), ("pipelined", self.planned(receivers))):
                result = self.broadcast(receivers, sources, check_blob=num_workers == max(NUM_WORKERS))
                run = {
                    "mode": mode,
                    "num_workers": num_workers,
                    "seconds": result["seconds"],
                    "bytes": result["bytes"],
                    "learner_bytes": result["learner_bytes"],
                    "floor_s": round(self.floor_s, 3),
                    "ratio": round(result["seconds"] / self.floor_s, 3),
                    "blob_ok": result["blob_ok"],
                    "failures": result["failures"],
                }
                log.info(
                    "N=%2d %-11s %7.2fs  floor %.2fs  ratio %.3f",
                    num_workers,
                    mode,
                    run["seconds"],
                    self.floor_s,
                    run["ratio"],
                )
                runs.append(run)
        return runs

    def heterogeneous(self) -> dict:
        speeds = {name: HETEROGENEOUS_MBPS[i % len(HETEROGENEOUS_MBPS)] for i, name in enumerate(self.workers)}
        for name, mbps in speeds.items():
            self.wan.set_link(name, Link(mbps, mbps))
        fast, slow = (next(n for n, s in speeds.items() if s == target) for target in (400, 100))
        fast_peer = [n for n, s in speeds.items() if s == 400][1]
        slow_peer = [n for n, s in speeds.items() if s == 100][1]
        calibration = [calibrate(self.wan, fast, fast_peer, 64 << 20), calibrate(self.wan, slow, slow_peer, 32 << 20)]
        own_floor_s = {
            name: self.args.size_bytes * 8 / (min(self.args.mbps, mbps) * 1e6) for name, mbps in speeds.items()
        }
        outcome = {
            "link_mbps": speeds,
            "learner_uplink_mbps": self.args.mbps,
            "calibration": calibration,
            "floor_s": round(max(own_floor_s.values()), 3),
        }
        for label, ranked in (("ranked_by_bandwidth", True), ("registration_order", False)):
            sources = self.planned(self.workers, ranked=ranked)
            result = self.broadcast(self.workers, sources, check_blob=True)
            per_worker_ratio = [result["per_worker_s"][n] / own_floor_s[n] for n in self.workers]
            outcome[label] = {
                "seconds": result["seconds"],
                "ratio": round(result["seconds"] / outcome["floor_s"], 3),
                "mean_worker_s": round(sum(result["per_worker_s"].values()) / len(self.workers), 3),
                "mean_ratio_to_own_floor": round(sum(per_worker_ratio) / len(per_worker_ratio), 3),
                "chain": self.depth_order(sources),
                "per_worker_s": result["per_worker_s"],
                "learner_bytes": result["learner_bytes"],
                "blob_ok": result["blob_ok"],
            }
            log.info(
                "heterogeneous %-19s %7.2fs (floor %.2fs), mean worker/own floor %.3f",
                label,
                result["seconds"],
                outcome["floor_s"],
                outcome[label]["mean_ratio_to_own_floor"],
            )
        for name in self.workers:
            self.wan.set_link(name, Link(self.args.mbps, self.args.mbps))
        return outcome

    def parent_killed(self) -> dict:
        sources = self.planned(self.workers)
        chain = self.depth_order(sources)
        victim, orphan = chain[3], chain[4]  # depth 4 and its child
        kill_after_s = 0.4 * self.floor_s
        result = self.broadcast(self.workers, sources, kill=victim, kill_after_s=kill_after_s, check_blob=True)
        outcome = {
            "num_workers": len(self.workers),
            "killed": victim,
            "killed_depth": 4,
            "killed_after_s": round(kill_after_s, 3),
            "orphan": orphan,
            "orphan_failover": result["failures"].get(orphan, []),
            "num_completed": len(result["per_worker_s"]),
            "seconds": result["seconds"],
            "floor_s": round(self.floor_s, 3),
            "ratio": round(result["seconds"] / self.floor_s, 3),
            "per_worker_s": result["per_worker_s"],
            "blob_ok": result["blob_ok"],
            "learner_bytes": result["learner_bytes"],
        }
        log.info(
            "parent killed: %s at %.1fs; %d of %d completed in %.2fs (ratio %.3f); %s failed over: %s",
            victim,
            kill_after_s,
            outcome["num_completed"],
            len(self.workers) - 1,
            result["seconds"],
            outcome["ratio"],
            orphan,
            outcome["orphan_failover"],
        )
        return outcome


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, style in (("one_to_many", "o-"), ("pipelined", "s-")):
        runs = [r for r in results["runs"] if r["mode"] == mode]
        left.plot([r["num_workers"] for r in runs], [r["seconds"] for r in runs], style, label=mode.replace("_", "-"))
    left.plot(NUM_WORKERS, [results["floor_s"]] * len(NUM_WORKERS), "k--", label="floor size / B")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="receivers N",
        ylabel="seconds to the last receiver",
        title=f"{results['payload_bytes'] >> 20} MiB, every link {results['link_mbps']:g} Mbit/s (tc tbf)",
    )
    left.set_xticks(NUM_WORKERS, [str(n) for n in NUM_WORKERS])
    left.legend()
    het = results["heterogeneous"]
    for label, style in (("ranked_by_bandwidth", "s"), ("registration_order", "x")):
        times = sorted(het[label]["per_worker_s"].values())
        right.plot(range(1, len(times) + 1), times, style, label=f"heterogeneous, {label.replace('_', ' ')}")
    killed = sorted(results["parent_killed"]["per_worker_s"].values())
    right.plot(
        range(1, len(killed) + 1), killed, "^", label=f"parent killed at depth 4 (homogeneous, {len(killed)} left)"
    )
    right.axhline(results["floor_s"], color="k", linestyle="--", label="floor at B")
    right.axhline(het["floor_s"], color="grey", linestyle=":", label="floor of the slowest link")
    right.set(xlabel="receivers, by finish time", ylabel="seconds to finish", title="16 receivers: pipelined relay")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(runs: list[dict], floor_s: float) -> dict[str, dict]:
    by_n: dict[str, dict] = {}
    for run in runs:
        row = by_n.setdefault(str(run["num_workers"]), {"floor_s": round(floor_s, 3)})
        row[f"{run['mode']}_s"] = run["seconds"]
        row[f"{run['mode']}_ratio"] = run["ratio"]
    return by_n


def raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.broadcast", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-bytes", type=int, default=256 << 20, help="payload (default 256 MiB)")
    parser.add_argument("--chunk-size-bytes", type=int, default=512 << 10, help="chunk (default 512 KiB)")
    parser.add_argument(
        "--mbps", type=float, default=200.0, help="B: the learner's uplink and every worker's link, Mbit/s"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)  # `kill <pid>` cleans up like Ctrl-C
    bench = Bench(args)
    started_s = time.monotonic()
    try:
        calibration = bench.start()
        runs = bench.sweep()
        heterogeneous = bench.heterogeneous()
        killed = bench.parent_killed()
    finally:
        bench.stop()
    results = {
        "command": "make bench-broadcast  (python -m benchmarks.broadcast, as root)",
        "payload_bytes": args.size_bytes,
        "chunk_size_bytes": args.chunk_size_bytes,
        "link_mbps": args.mbps,
        "floor_s": round(bench.floor_s, 3),
        "link_emulation": "network namespace per node, veth into one bridge, tc tbf on both directions of every link "
        "(rate B, burst 256kb, a 5 s drop-tail queue: no fair queueing in this kernel), MTU 65000 so the cap is the goodput",
        "calibration": calibration,
        "plan": "shared/relay_plan.py: num_seeds=1, fanout=1 (a chain ranked by bandwidth), fallbacks = other ancestors then other branches",
        "runs": runs,
        "table": table(runs, bench.floor_s),
        "heterogeneous": heterogeneous,
        "parent_killed": killed,
        "wall_s": round(time.monotonic() - started_s, 1),
        "cpu_count": os.cpu_count(),
        "node_logs": str(bench.log_dir),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "broadcast.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "broadcast.png")
    print(json.dumps(results["table"], indent=2))
    print(f"wrote {args.out / 'broadcast.json'} and broadcast.png in {results['wall_s']}s")


if __name__ == "__main__":
    main()
