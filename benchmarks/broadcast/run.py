"""make bench-broadcast: end-to-end weight broadcast, one-to-many vs pipelined relay, over capped links.

Real processes running the project's code on an emulated WAN (cluster/wan/namespaces.py: a network
namespace per node, MTU 1500, `tc tbf` with a 100 ms drop-tail queue on both directions of every link):
the learner node (redis-server, ChunkServer, the real WeightPublisher publishing a torch module of
random bf16 tensors) and up to 16 receivers (the real WeightsSync following `weights` on the learner's
Redis, relaying from their own ChunkServer). See docs/broadcast_benchmark.md.

    calibrate     raw TCP through one link (= the goodput cap) and N flows out of the learner at once
    for N in 1, 2, 4, 8, 16, each a fresh run (run id) with fresh receiver processes:
        one-to-many   every receiver streams the whole version from the learner
        pipelined     the coordinator's plan (shared/weight_channel/relay_plan.py: one seed, a chain ranked by bandwidth)
        window        learner: time.time() right before `publish` (serialise, hash, chunk, sign, store,
                      announce all inside) -> receiver: `on_ready` (verified full weights ready to load)
        pause         then the first and the last receiver, one at a time, load the ready version into a
                      torch module (services/learner/publish.load_weights_blob): the engine's pause per swap
    heterogeneous 16 receivers at 400/100/200/200 Mbit/s, ranked by bandwidth     (--extras)
    parent killed N = 16 pipelined, the receiver at depth 4 SIGKILLed 40% into the transfer (--extras)

Writes benchmarks/results/broadcast.json and broadcast.png. Needs root; ~11 minutes on 2 cores
(`--quick`: 32 MiB, N in 1 and 4, ~2 minutes).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.broadcast.report import plot, summarize
from cluster.redis_server import find_server_binary
from cluster.wan.namespaces import (
    GOODPUT_FRACTION,
    MTU_BYTES,
    QUEUE_MS,
    TBF_BURST,
    Link,
    Wan,
    calibrate,
    shared_uplink,
)
from shared.weight_channel import RELAY_PIECE_BYTES, RelayCandidate, plan_relay

log = logging.getLogger("bench-broadcast")

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
QUICK_OUT_DIR = Path(tempfile.gettempdir()) / "rlb-quick"
RUN_LOCK_PATH = Path(tempfile.gettempdir()) / "rlb-bench.lock"
NUM_RECEIVERS = (1, 2, 4, 8, 16)
QUICK_NUM_RECEIVERS = (1, 4)
HETEROGENEOUS_MBPS = (400, 100, 200, 200)  # repeated over 16 receivers in registration order
NODE_PORT = 8000  # benchmarks/broadcast/node.py PORT
REDIS_PORT = 6379
EVENT_TIMEOUT_S = 600.0


@dataclass
class Node:
    """One benchmark process in its namespace; its stdout lines are JSON events, read by a thread."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    events: queue.Queue = field(default_factory=queue.Queue)

    def start_reader(self) -> None:
        def read() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                if line.startswith("{"):
                    self.events.put(json.loads(line))
            self.events.put({"event": "exited", "code": self.popen.wait()})

        threading.Thread(target=read, name=f"read-{self.name}", daemon=True).start()

    def send(self, command: dict) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(command) + "\n")
        self.popen.stdin.flush()

    def expect(self, kind: str, timeout_s: float = EVENT_TIMEOUT_S) -> dict:
        try:
            event = self.events.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no {kind!r} within {timeout_s}s") from None
        if event["event"] != kind:
            raise RuntimeError(f"{self.name}: expected {kind!r}, got {event} (see {self.log_path})")
        return event

    def ask_to_quit(self) -> None:
        if self.popen.poll() is None:
            try:
                self.send({"cmd": "quit"})
            except OSError:  # its stdin is gone: it is exiting (or killed)
                pass

    def stop(self, timeout_s: float = 10.0) -> None:
        """Quit politely (see ask_to_quit), then SIGKILL by PID."""
        self.ask_to_quit()
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def stop_all(nodes: list[Node]) -> None:
    """Every node asked first, then waited for: their shutdowns (a sync thread's last XREAD) overlap."""
    for node in nodes:
        node.ask_to_quit()
    deadline_s = time.monotonic() + 10.0
    for node in nodes:
        node.stop(timeout_s=max(0.1, deadline_s - time.monotonic()))


def cpu_jiffies() -> tuple[int, int, int]:
    """(busy, softirq, total) jiffies of the whole machine from /proc/stat. softirq is mostly the kernel
    moving packets through the emulated links (veth, bridge, tbf): cost of the emulation, not of a node."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, fields[6], sum(fields)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.wan = Wan()
        self.learner: Node | None = None
        self.redis: subprocess.Popen | None = None
        self.receivers: dict[str, Node] = {}
        self.version = 0
        self.log_dir = Path(tempfile.mkdtemp(prefix="rlb-logs-"))
        self.workers = [f"w{i}" for i in range(max(args.num_receivers))]

    def url(self, name: str) -> str:
        return f"http://{self.wan.address[name]}:{NODE_PORT}"

    # setup and teardown
    def start(self) -> dict:
        Wan.check_available()
        take_run_lock()
        self.wan.remove_leftovers()
        self.wan.create_bridge()
        self.wan.add_node("l", Link(self.args.mbps, self.args.mbps))
        for name in self.workers:
            self.wan.add_node(name, Link(self.args.mbps, self.args.mbps))
        calibration = {
            "one_flow": calibrate(self.wan, "l", "w0", 64 << 20),
            "shared_uplink": shared_uplink(self.wan, "l", self.workers, (128 << 20) // len(self.workers)),
        }
        log.info("calibration: %s", calibration)
        address = self.wan.address["l"]
        self.redis = subprocess.Popen(
            self.wan.command(
                "l",
                self.nice_prefix()
                + [
                    find_server_binary(),
                    "--bind",
                    address,
                    "--port",
                    str(REDIS_PORT),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]
                + ["--protected-mode", "no", "--logfile", str(self.log_dir / "redis.log")],
            ),
            stdout=subprocess.DEVNULL,
        )
        spill_dir = self.log_dir / "published"  # the learner's spill folder, as runs/<id>/published/ (a disk)
        self.learner = self.start_node("l", ["--role", "learner", "--spill-dir", str(spill_dir)])
        self.learner.expect("up", 300.0)
        return calibration

    def start_node(self, name: str, role_args: list[str]) -> Node:
        argv = [
            sys.executable,
            "-m",
            "benchmarks.broadcast.node",
            "--host",
            self.wan.address[name],
            "--redis-url",
            f"redis://{self.wan.address['l']}:{REDIS_PORT}/0",
            "--size-bytes",
            str(self.args.size_bytes),
            "--chunk-size-bytes",
            str(self.args.chunk_size_bytes),
            "--receive-into",
            self.args.receive_into,
            "--chunk-wait-s",
            str(self.args.chunk_wait_s),
            *([] if self.args.steady_state else ["--cold"]),
            *role_args,
        ]
        log_path = self.log_dir / f"{name}.log"
        stderr = open(log_path, "ab")  # noqa: SIM115 (closed when the process exits)
        popen = subprocess.Popen(
            self.wan.command(name, [*self.nice_prefix(), *argv]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        node = Node(name, popen, log_path)
        node.start_reader()
        return node

    def nice_prefix(self) -> list[str]:
        """`nice -n N` before a node's program (`--nice`; it execs, so the PID stays the program's)."""
        return ["nice", "-n", str(self.args.nice)] if self.args.nice else []

    def stop(self) -> None:
        stop_all([*self.receivers.values(), *([self.learner] if self.learner else [])])
        if self.redis is not None and self.redis.poll() is None:
            os.kill(self.redis.pid, signal.SIGTERM)
            try:
                self.redis.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.redis.pid, signal.SIGKILL)
                self.redis.wait()
        self.wan.remove()
        # the learner's spilled versions (hundreds of MB each) go; the node logs stay for a look (node_logs)
        shutil.rmtree(self.log_dir / "published", ignore_errors=True)

    # one broadcast
    def broadcast(
        self, label: str, holders: dict[str, list[str]], *, kill: str | None = None, kill_after_s: float = 0.0
    ) -> dict:
        """A fresh run: receivers started with their holders (the plan), one version published, every
        (surviving) receiver's `ready`, then the pause of the first and last. Returns the raw events."""
        self.version += 1
        run_id = f"bench-{label}-{self.version}"
        weights_root = Path(tempfile.mkdtemp(prefix="rlb-weights-"))  # file mode: a disk, as on a worker
        names = list(holders)
        try:
            for name in names:
                extra = ["--weights-dir", str(weights_root / name)] if self.args.receive_into == "file" else []
                self.receivers[name] = self.start_node(
                    name, ["--role", "receiver", "--run-id", run_id, "--holders", json.dumps(holders[name]), *extra]
                )
            for name in names:
                self.receivers[name].expect("up", 600.0)  # 16 torch imports at once on a busy 2-core machine
            for name in names:
                self.receivers[name].send({"cmd": "arm"})
                self.receivers[name].expect("armed")
            return self.publish_and_wait(run_id, names, kill, kill_after_s)
        finally:
            stop_all([self.receivers.pop(name) for name in names if name in self.receivers])
            shutil.rmtree(weights_root, ignore_errors=True)

    def publish_and_wait(self, run_id: str, names: list[str], kill: str | None, kill_after_s: float) -> dict:
        assert self.learner is not None
        busy_0, softirq_0, total_0 = cpu_jiffies()
        learner_bytes_0 = self.wan.uplink_bytes("l")
        self.learner.send({"cmd": "cpu"})
        learner_cpu_0 = self.learner.expect("cpu")["cpu_s"]
        self.learner.send({"cmd": "publish", "run_id": run_id, "version": self.version})
        killer = None
        if kill is not None:
            victim = self.receivers[kill].popen.pid
            killer = threading.Timer(kill_after_s, os.kill, (victim, signal.SIGKILL))
            killer.start()
        try:
            published = self.learner.expect("published")
            ready = {name: self.receivers[name].expect("ready") for name in names if name != kill}
        finally:
            if killer is not None:
                killer.cancel()  # a no-op once it fired; never a late SIGKILL after an error
        busy_1, softirq_1, total_1 = cpu_jiffies()
        self.learner.send({"cmd": "cpu"})
        learner_cpu_s = self.learner.expect("cpu")["cpu_s"] - learner_cpu_0
        learner_wire_bytes = self.wan.uplink_bytes("l") - learner_bytes_0
        if killer is not None:
            killer.join()
        pause_s = {}
        for name in dict.fromkeys([names[0], names[-1]]):  # one at a time: nothing competes
            if name == kill:
                continue
            self.receivers[name].send({"cmd": "load"})
            pause_s[name] = self.receivers[name].expect("loaded")["pause_s"]
        return {
            "published": published,
            "ready": ready,
            "machine_busy_fraction": (busy_1 - busy_0) / max(1, total_1 - total_0),
            "machine_softirq_fraction": (softirq_1 - softirq_0) / max(1, total_1 - total_0),
            "learner_cpu_s": learner_cpu_s,
            "learner_wire_bytes": learner_wire_bytes,
            "pause_s": pause_s,
            "learner_url": self.url("l"),
        }

    # holders per mode
    def planned(self, receivers: list[str]) -> dict[str, list[str]]:
        """Holders per receiver from the coordinator's rule (shared/weight_channel/relay_plan.py) on their link speeds:
        parent then fallbacks (the learner, last resort, is added by WeightsSync). Keys in chain order."""
        ids = {f"{index:03d}": name for index, name in enumerate(receivers)}
        candidates = [RelayCandidate(i, self.url(name), self.wan.links[name].down_mbps) for i, name in ids.items()]
        plan = plan_relay(candidates, num_seeds=1, fanout=1)
        ranked = sorted(plan.assignments.values(), key=lambda a: a.depth)
        return {ids[a.worker_id]: [u for u in (a.parent_url, *a.fallback_urls) if u] for a in ranked}

    def measure(self, mode: str, num_receivers: int, outcome: dict) -> dict:
        """One row of raw per-receiver figures (report.py turns them into the table)."""
        published = outcome["published"]
        started_at_s = published["started_at_s"]
        receivers = {
            name: {
                "end_to_end_s": event["ready_at_s"] - started_at_s,
                "transfer_only_s": event["transfer_done_at_s"] - event["published_at_s"],
                "announcement_read_s": event["fetch_started_at_s"] - event["published_at_s"],
                "ready_after_transfer_s": event["ready_at_s"] - event["transfer_done_at_s"],  # assembly, full hash
                "num_bytes": event["num_bytes"],
                "from_learner": event["source_url"].rstrip("/") == outcome["learner_url"],
                "cpu_s": event["cpu_s"],
            }
            for name, event in outcome["ready"].items()
        }
        return {
            "mode": mode,
            "num_receivers": num_receivers,
            "total_size_bytes": published["total_size_bytes"],
            "publish_s": published["publish_s"],
            "machine_busy_fraction": outcome["machine_busy_fraction"],
            "machine_softirq_fraction": outcome["machine_softirq_fraction"],
            "learner_cpu_s": outcome["learner_cpu_s"],
            "cpu_count": os.cpu_count() or 1,
            "learner_wire_bytes": outcome["learner_wire_bytes"],
            "pause_s": outcome["pause_s"],
            "receivers": receivers,
        }

    # scenarios
    def sweep(self) -> list[dict]:
        runs = []
        for num_receivers in self.args.num_receivers:
            names = self.workers[:num_receivers]
            learner_only: dict[str, list[str]] = {name: [] for name in names}  # WeightsSync adds the learner
            scenarios = (("one_to_many", learner_only), ("pipelined", self.planned(names)))
            for mode, holders in ((mode, holders) for mode, holders in scenarios if mode in self.args.modes):
                run = self.measure(mode, num_receivers, self.broadcast(f"n{num_receivers}-{mode}", holders))
                slowest = max(r["end_to_end_s"] for r in run["receivers"].values())
                log.info("N=%2d %-11s end to end %.2fs, publish %.2fs", num_receivers, mode, slowest, run["publish_s"])
                runs.append(run)
        return runs

    def heterogeneous(self) -> dict:
        speeds = {name: HETEROGENEOUS_MBPS[i % len(HETEROGENEOUS_MBPS)] for i, name in enumerate(self.workers)}
        for name, mbps in speeds.items():
            self.wan.set_link(name, Link(mbps, mbps))
        try:
            run = self.measure(
                "pipelined", len(self.workers), self.broadcast("heterogeneous", self.planned(self.workers))
            )
        finally:
            for name in self.workers:
                self.wan.set_link(name, Link(self.args.mbps, self.args.mbps))
        log.info("heterogeneous: end to end %.2fs", max(r["end_to_end_s"] for r in run["receivers"].values()))
        return {"link_mbps": speeds, "learner_uplink_mbps": self.args.mbps, **run}

    def parent_killed(self, line_floor_s: float) -> dict:
        holders = self.planned(self.workers)
        chain = list(holders)
        victim, orphan = chain[3], chain[4]  # depth 4 and its child
        kill_after_s = 0.4 * line_floor_s
        orphan_log = self.log_dir / f"{orphan}.log"  # appended to by every scenario: read only what this one adds
        log_offset = orphan_log.stat().st_size if orphan_log.exists() else 0
        outcome = self.broadcast("parent-killed", holders, kill=victim, kill_after_s=kill_after_s)
        run = self.measure("pipelined", len(self.workers), outcome)
        with open(orphan_log, errors="replace") as lines:
            lines.seek(log_offset)
            failover = [line.strip() for line in lines if "switching" in line]  # RelayFetcher's warning
        slowest = max(r["end_to_end_s"] for r in run["receivers"].values())
        log.info("parent killed: %d of %d ready, end to end %.2fs", len(run["receivers"]), len(chain) - 1, slowest)
        return {
            "killed": victim,
            "killed_depth": 4,
            "killed_after_s": round(kill_after_s, 3),
            "orphan": orphan,
            "orphan_failover": failover,
            **run,
        }


_run_lock: list[object] = []  # the open lock file, held for the life of the process


def take_run_lock() -> None:
    """One benchmark at a time: a second run's clean-up of `rlb-*` leftovers would tear down a running
    one's network. Raises if another run holds the lock (released by the kernel when that process ends)."""
    import fcntl

    lock = open(RUN_LOCK_PATH, "a+")  # noqa: SIM115 (held open until exit)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        raise RuntimeError(f"another bench-broadcast is running (pid {lock.read().strip()}; {RUN_LOCK_PATH})") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    _run_lock.append(lock)


def raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.broadcast", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-bytes", type=int, default=256 << 20, help="the model's bf16 bytes (default 256 MiB)")
    parser.add_argument("--chunk-size-bytes", type=int, default=512 << 10, help="chunk (default 512 KiB)")
    parser.add_argument("--mbps", type=float, default=200.0, help="B: the learner's uplink and every link, Mbit/s")
    parser.add_argument(
        "--receive-into",
        choices=["memory", "file"],
        default="memory",
        help="ready = in memory (torch engine) or the verified safetensors file complete (vLLM)",
    )
    parser.add_argument(
        "--chunk-wait-s",
        type=float,
        default=10.0,
        help="[broadcast] chunk_wait_s of every node: a request for a chunk not held yet gives up after this "
        "long without progress on its version",
    )
    parser.add_argument(
        "--modes",
        default="one_to_many,pipelined",
        help="comma-separated, of one_to_many and pipelined (one cell of the matrix: --modes pipelined)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run every node (and Redis) at this niceness, e.g. -10 on a machine other jobs share: their CPU "
        "then waits for the nodes' (the kernel's packet work is softirq either way); recorded in the results",
    )
    parser.add_argument(
        "--name", default="broadcast", help="results file stem: <out>/<name>.json and <name>.png (default broadcast)"
    )
    parser.add_argument(
        "--extras", action=argparse.BooleanOptionalAction, default=True, help="heterogeneous + parent killed"
    )
    parser.add_argument(
        "--num-receivers",
        default=",".join(map(str, NUM_RECEIVERS)),
        help="N values, comma-separated (extras need >= 6)",
    )
    parser.add_argument(
        "--cold",
        dest="steady_state",
        action="store_false",
        help="no warm-up: every process meets its first version, buffers faulted in inside the window "
        "(default: steady state, as in a run where a version arrives every step)",
    )
    parser.add_argument("--quick", action="store_true", help="check the harness: 32 MiB, N in 1 and 4, no extras")
    parser.add_argument("--out", type=Path, default=None, help=f"default {RESULTS_DIR} (--quick: {QUICK_OUT_DIR})")
    args = parser.parse_args()
    args.num_receivers = tuple(int(n) for n in args.num_receivers.split(","))
    args.modes = tuple(args.modes.split(","))
    if not args.modes or not set(args.modes) <= {"one_to_many", "pipelined"}:
        raise ValueError(f"--modes takes one_to_many and/or pipelined, got {','.join(args.modes)!r}")
    if args.quick:
        args.size_bytes, args.num_receivers, args.extras = 32 << 20, QUICK_NUM_RECEIVERS, False
    if "pipelined" not in args.modes:
        raise ValueError("--modes must include pipelined (the table's targets and the CPU model are about it)")
    if args.extras and max(args.num_receivers) < 6:
        raise ValueError("--extras (a parent killed at depth 4) needs an N >= 6 in --num-receivers; or --no-extras")
    if args.out is None:  # a harness check never overwrites the committed results
        args.out = QUICK_OUT_DIR if args.quick else RESULTS_DIR
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)  # `kill <pid>` cleans up like Ctrl-C
    signal.signal(signal.SIGINT, raise_keyboard_interrupt)  # also when started in the background (SIGINT ignored)
    bench = Bench(args)
    started_s = time.monotonic()
    extras: dict[str, Any] = {}
    try:
        calibration = bench.start()
        runs = bench.sweep()
        if args.extras:
            extras["heterogeneous"] = bench.heterogeneous()
            extras["parent_killed"] = bench.parent_killed(runs[0]["total_size_bytes"] * 8 / (args.mbps * 1e6))
    finally:
        bench.stop()
    results = {
        "command": "python -m benchmarks.broadcast "
        + " ".join(sys.argv[1:])
        + "  (make bench-broadcast: no options; as root)",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "payload_bytes": args.size_bytes,
        "chunk_size_bytes": args.chunk_size_bytes,
        "chunk_wait_s": args.chunk_wait_s,
        "node_niceness": args.nice,
        "relay": f"cut-through: a relay forwards each chunk in pieces of {RELAY_PIECE_BYTES} bytes as they arrive, "
        "then its verdict byte; every receiver verifies every chunk against the signed manifest",
        "link_mbps": args.mbps,
        "receive_into": args.receive_into,
        "state": "steady: every process has held a version before (the learner published one untimed, each "
        "receiver faulted in a version-sized buffer, as after its previous version; shared/weight_channel/buffers.py)"
        if args.steady_state
        else "cold: every process meets its first version (buffers faulted in inside the window)",
        "link_emulation": f"network namespace per node, veth into one bridge, MTU {MTU_BYTES}, tc tbf on both "
        f"directions of every link (rate {args.mbps:g} Mbit/s, burst {TBF_BURST}, a {QUEUE_MS:g} ms drop-tail queue; "
        f"no fair queueing in this kernel); TCP goodput at most {GOODPUT_FRACTION:.4f} of the line rate",
        "plan": "shared/weight_channel/relay_plan.py: num_seeds=1, fanout=1 (a chain ranked by bandwidth), fallbacks = other ancestors then other branches",
        "calibration": calibration,
        **summarize(runs, extras, args.mbps, args.chunk_size_bytes),
        "wall_s": round(time.monotonic() - started_s, 1),
        "cpu_count": os.cpu_count(),
        "node_logs": str(bench.log_dir),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / f"{args.name}.png")
    print(json.dumps(results["table"], indent=2))
    print(f"wrote {args.out / args.name}.json and .png in {results['wall_s']}s")


if __name__ == "__main__":
    main()
