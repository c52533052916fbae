"""1000 simulated workers heartbeating once a second against one coordinator process on this machine.

    python -m benchmarks.load_heartbeat                 # or: make bench-load
    python -m benchmarks.load_heartbeat --workers 1000 --duration-s 45
    python -m benchmarks.load_heartbeat --burn-cores 1       # with a neighbour process spinning on one core

Starts a private redis-server and `python -m services.coordinator` (a real uvicorn process, its control
loop and lease sweeper running), registers N workers over REST, then every simulated worker sends a
realistic heartbeat (progress counters, throughput, its latest weight swap) once a second on its own
keep-alive connection, phases spread evenly over the second. The load generator is a small asyncio
HTTP/1.1 client (one uvloop event loop, a raw protocol per connection) so it costs the shared 2 cores
as little as possible. Reports latency percentiles of the heartbeats sent after a warm-up, errors
(non-200 answers, timeouts, broken connections), the achieved rate, the CPU of the coordinator, Redis
and the load generator, how many heartbeats shared each Redis call, and the machine's CPU steal (time
the hypervisor gave to other tenants of this host). Runs `--repeat` times (3), each with its own Redis
and coordinator. Writes every run to benchmarks/results/load_heartbeat.json. (Until 2026-11-28 a
`--baseline REV` mode also ran an older commit's coordinator from a git worktree in alternation; the
committed results are such runs, their `summary` keyed by the code that ran.)
Target: no errors, p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx
import uvloop

from benchmarks.result_file import write_result
from cluster.ports import free_port
from cluster.redis_server import RedisServer
from shared.bus import StreamBus, connect
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.streams import WEIGHTS

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "load_heartbeat.json"
RUN_TOML = """\
run_id = "load"
[rollout]
heartbeat_interval_s = 1.0
[coordinator]
lease_s = 30.0
[activation]
replan_interval_s = {replan_interval_s}
[credentials]  # 1,000 simulated workers under open registration are one credential: no cap in the way
max_workers = 100000
registrations_per_min = 1e7
registrations_per_min_per_address = 1e7
"""
REQUEST_TIMEOUT_S = 5.0


@dataclass
class Stats:
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    num_sent: int = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


SWAP_ANNOUNCED_AT_S = time.time() - 30.0


def heartbeat_body(worker_index: int, beat: int, with_swap: bool) -> bytes:
    body: dict[str, object] = {
        "policy_version": 3,
        "num_groups_done": beat * 2,
        "num_samples_done": beat * 16,
        "samples_per_s": 8.0 + worker_index % 7,
        "generating": True,
        "tokens_per_s": 120.0,
        "group_latency_s": 0.8,
    }
    if with_swap:  # every heartbeat repeats the worker's latest swap (version 3), as real workers do
        body["last_swap"] = {
            "policy_version": 3,
            "announced_at_s": SWAP_ANNOUNCED_AT_S,
            "swapped_at_s": SWAP_ANNOUNCED_AT_S + 1.0,
            "num_bytes": 500_000,
            "source_url": "http://127.0.0.1:9/",
        }
    return json.dumps(body).encode()


class Connection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection, one request at a time: a raw protocol rather than asyncio
    streams, because the generator shares the 2 cores with what it measures."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.answer: asyncio.Future[int] | None = None
        self.body = b""  # the last answer's body

    @classmethod
    async def open(cls, port: int) -> Self:
        _, connection = await asyncio.get_running_loop().create_connection(cls, "127.0.0.1", port)
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = bytes(self.buffer[:head_end]).lower()
        length_at = head.find(b"content-length:")
        length = int(head[length_at + 15 :].split(b"\r\n", 1)[0]) if length_at >= 0 else 0
        if len(self.buffer) < head_end + 4 + length:
            return
        status = int(head.split(b" ", 2)[1])
        self.body = bytes(self.buffer[head_end + 4 : head_end + 4 + length])
        del self.buffer[: head_end + 4 + length]
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionResetError("the coordinator closed the connection"))

    async def request(self, payload: bytes, timeout_s: float) -> int:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return await asyncio.wait_for(self.answer, timeout=timeout_s)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def worker_loop(
    index: int,
    worker_id: str,
    token: str,
    port: int,
    start_at: float,
    end_at: float,
    warmup_until: float,
    stats: Stats,
    with_swap: bool,
) -> None:
    """One simulated worker: a keep-alive connection, a heartbeat every second at its own phase."""
    connection = await Connection.open(port)
    head = (
        f"POST /v1/workers/{worker_id}/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    beat = 0
    next_at = start_at
    try:
        while next_at < end_at:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            body = heartbeat_body(index, beat, with_swap)
            sent_at = time.monotonic()
            stats.num_sent += 1
            try:
                status = await connection.request(
                    head + b"Content-Length: %d\r\n\r\n" % len(body) + body, REQUEST_TIMEOUT_S
                )
            except (TimeoutError, ConnectionError) as exc:
                stats.error("timeout" if isinstance(exc, TimeoutError) else type(exc).__name__)
                connection.close()
                connection = await Connection.open(port)
            else:
                if status != 200:
                    stats.error(f"http {status}")
                elif sent_at >= warmup_until:
                    stats.latencies_s.append(time.monotonic() - sent_at)
            beat += 1
            next_at += 1.0
    finally:
        connection.close()


async def drive(
    workers: list[tuple[str, str]], port: int, duration_s: float, warmup_s: float, with_swap: bool
) -> Stats:
    stats = Stats()
    start = time.monotonic() + 1.0
    end = start + duration_s
    tasks = [
        asyncio.create_task(
            worker_loop(i, worker_id, token, port, start + i / len(workers), end, start + warmup_s, stats, with_swap)
        )
        for i, (worker_id, token) in enumerate(workers)
    ]
    await asyncio.gather(*tasks)
    return stats


def announce_swapped_version(redis_url: str) -> None:
    """The learner's announcement of the version every simulated worker reports having swapped in: the
    coordinator records swaps only of versions the learner announced (services/coordinator/announcements.py)."""
    announcement = WeightsPublished(
        run_id="load",
        policy_version=3,
        manifest_url="http://127.0.0.1:9/v1/weights/3/manifest",
        manifest_sha256="0" * 64,
        total_size_bytes=500_000,
        num_chunks=1,
        published_at_s=SWAP_ANNOUNCED_AT_S,
    )
    client = connect(redis_url)
    StreamBus(client, RunKeys("load"), service="benchmark").publish(WEIGHTS, announcement)
    client.close()


def register_workers(base_url: str, num_workers: int) -> list[tuple[str, str]]:
    workers = []
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        for i in range(num_workers):
            response = client.post("/v1/workers", json={"name": f"load-{i:04d}", "price_per_hour": 0.0})
            while response.status_code == 429:  # the registration rate limit: register_s includes its waits
                time.sleep(float(response.headers.get("Retry-After", "1")))
                response = client.post("/v1/workers", json={"name": f"load-{i:04d}", "price_per_hour": 0.0})
            response.raise_for_status()
            workers.append((response.json()["worker_id"], response.json()["token"]))
    return workers


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def heartbeat_batching(base_url: str) -> float | None:
    """Mean heartbeats per Redis script call on the coordinator's fast path, from its /metrics."""
    values = {}
    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("relayrl_coordinator_fast_heartbeats_total", "relayrl_coordinator_heartbeat_script_calls_total"):
            values[name] = float(value)
    calls = values.get("relayrl_coordinator_heartbeat_script_calls_total", 0.0)
    return round(values["relayrl_coordinator_fast_heartbeats_total"] / calls, 2) if calls else None


def cpu_times() -> list[int]:
    """The machine's cumulative CPU jiffies: user nice system idle iowait irq softirq steal."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def python_speed_s() -> float:
    """Seconds for a fixed pure-Python loop: this shared machine's speed varies several-fold over a day."""
    started = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load_heartbeat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--duration-s", type=float, default=45.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--no-swap-reports", action="store_true", help="heartbeats without the latest weight swap")
    parser.add_argument("--repeat", type=int, default=3, help="independent runs, back to back (this machine is noisy)")
    parser.add_argument(
        "--replan-interval-s",
        type=float,
        default=1.0,
        help="the coordinator's periodic control-loop pass interval (the run file's default: 1)",
    )
    parser.add_argument(
        "--burn-cores",
        type=int,
        default=0,
        help="keep this many busy-loop processes running meanwhile: a noisy neighbour you can reproduce",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        for _ in range(args.burn_cores):
            stack.enter_context(busy_loop())
        trees = {"working tree": REPO_ROOT}
        runs = []
        for index in range(args.repeat):
            for code, tree in trees.items():
                print(f"run {index + 1}/{args.repeat}: {code}", flush=True)
                runs.append({"code": code, **measure(args, tree)})
                print(json.dumps(runs[-1], indent=2), flush=True)
    result = {
        "command": "python -m benchmarks.load_heartbeat " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores shared by redis, the coordinator and the load generator",
        "workers": args.workers,
        "target": "no errors, p99 < 100 ms",
        "summary": {code: summary([run for run in runs if run["code"] == code]) for code in trees},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


def summary(runs: list[dict]) -> dict:
    return {
        "target_met_in_every_run": all(run["target_met"] for run in runs),
        "p99_ms_per_run": [run["latency_ms"]["p99"] for run in runs],
        "errors_per_run": [run["num_errors"] for run in runs],
        "coordinator_cpu_ms_per_heartbeat": [run["coordinator_cpu_ms_per_heartbeat"] for run in runs],
        "cpu_steal_percent_per_run": [run["machine_cpu_steal_percent"] for run in runs],
    }


@contextlib.contextmanager
def busy_loop() -> Iterator[None]:
    """A process spinning on one core until the block ends (stopped by PID)."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        process.kill()
        process.wait()


def measure(args: argparse.Namespace, tree: Path = REPO_ROOT) -> dict:
    """One run: a fresh Redis and the coordinator of `tree`, N workers registered, heartbeats for `duration_s`."""
    speed_s = python_speed_s()
    with (
        tempfile.TemporaryDirectory(prefix="load-") as tmp,
        RedisServer(Path(tmp) / "redis", append_only=True) as redis_server,
    ):
        run_file = Path(tmp) / "run.toml"
        run_file.write_text(RUN_TOML.format(replan_interval_s=args.replan_interval_s))
        port = free_port()
        env = {
            **os.environ,
            "RL_ADMIN_TOKEN": secrets.token_urlsafe(24),
            "RL_OPEN_REGISTRATION": "true",  # the benchmark registers its simulated fleet without a token
            "RL_REDIS_URL": redis_server.url,
            "RL_RUN_CONFIG": str(run_file),
            "RL_COORDINATOR_PORT": str(port),
            "RL_LOG_LEVEL": "WARNING",
        }
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "services.coordinator"],
            cwd=tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(Path(tmp) / "coordinator.log", "wb"),
        )
        try:
            base_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(base_url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if coordinator.poll() is not None or time.monotonic() > deadline:
                    sys.exit("the coordinator did not start:\n" + (Path(tmp) / "coordinator.log").read_text()[-3000:])
                time.sleep(0.2)
            announce_swapped_version(redis_server.url)
            started = time.monotonic()
            workers = register_workers(base_url, args.workers)
            register_s = time.monotonic() - started
            print(
                f"registered {len(workers)} workers in {register_s:.1f}s; heartbeating for {args.duration_s:.0f}s",
                flush=True,
            )
            cpu_before, wall_before, machine_before = cpu_seconds(coordinator.pid), time.monotonic(), cpu_times()
            redis_before = cpu_seconds(redis_server.process.pid)
            client_before = own_cpu_seconds()
            gc.collect()
            gc.freeze()  # the generator's own collector pauses would count as heartbeat latency
            stats = uvloop.run(drive(workers, port, args.duration_s, args.warmup_s, not args.no_swap_reports))
            wall_s = time.monotonic() - wall_before
            coordinator_cpu = (cpu_seconds(coordinator.pid) - cpu_before) / wall_s
            redis_cpu = (cpu_seconds(redis_server.process.pid) - redis_before) / wall_s
            client_cpu = (own_cpu_seconds() - client_before) / wall_s
            batching = heartbeat_batching(base_url)
            machine = [after - before for before, after in zip(machine_before, cpu_times(), strict=True)]
            listed = httpx.get(base_url + "/v1/workers", timeout=30).json()
            num_dead = sum(1 for w in listed if w["state"] == "dead")
        finally:
            coordinator.terminate()
            coordinator.wait(timeout=20)
            log_tail = (Path(tmp) / "coordinator.log").read_text(errors="replace")[-4000:]

    latencies_ms = [1000 * s for s in stats.latencies_s] or [float("nan")]
    result = {
        "swap_reports": not args.no_swap_reports,
        "replan_interval_s": args.replan_interval_s,
        "busy_loop_processes": args.burn_cores,
        "duration_s": args.duration_s,
        "heartbeats_sent": stats.num_sent,
        "heartbeats_measured": len(latencies_ms),
        "rate_per_s": round(stats.num_sent / args.duration_s, 1),
        "errors": stats.errors,
        "num_errors": sum(stats.errors.values()),
        "workers_declared_dead": num_dead,
        "latency_ms": {
            "p50": round(statistics.median(latencies_ms), 2),
            "p90": round(percentile(latencies_ms, 0.90), 2),
            "p99": round(percentile(latencies_ms, 0.99), 2),
            "p999": round(percentile(latencies_ms, 0.999), 2),
            "max": round(max(latencies_ms), 2),
            "mean": round(statistics.fmean(latencies_ms), 2),
        },
        "coordinator_cpu_cores": round(coordinator_cpu, 2),
        "coordinator_cpu_ms_per_heartbeat": round(1000 * coordinator_cpu * wall_s / max(1, stats.num_sent), 3),
        "load_generator_cpu_cores": round(client_cpu, 2),
        "redis_cpu_cores": round(redis_cpu, 2),
        "heartbeats_per_redis_call": batching,
        "machine_cpu_busy_percent": round(100 * (sum(machine) - machine[3] - machine[7]) / max(1, sum(machine)), 1),
        "machine_cpu_steal_percent": round(100 * machine[7] / max(1, sum(machine)), 1),
        "python_loop_2M_s": round(speed_s, 3),
        "register_s": round(register_s, 1),
    }
    result["target_met"] = result["num_errors"] == 0 and num_dead == 0 and result["latency_ms"]["p99"] < 100
    if result["num_errors"]:
        result["coordinator_log_tail"] = log_tail
    return result


if __name__ == "__main__":
    main()
