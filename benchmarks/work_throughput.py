"""make bench-work: groups per second the data plane takes from 1,000 simulated workers, through the path
workers had before (each its own Redis connection: XREADGROUP on `tasks`, then XADD to `rollouts` and XACK
in one MULTI) and through the path they have now (the coordinator's work API: POST /v1/work/lease, then
POST /v1/work/rollouts), side by side on one machine.

    python -m benchmarks.work_throughput [--workers 1000] [--duration-s 30] [--groups-per-call 4] [--repeat 2]

Each measurement starts a private redis-server and, for the work API, `python -m services.coordinator` (a
real uvicorn process with its control loop and lease sweeper), fills `tasks` with realistic TaskGroups (the
reward service's part, done before the clock starts), and runs N simulated workers in one uvloop event loop,
each on its own connection, as fast as they are answered (no generation time: this is the ceiling of the
path, not of a fleet). A worker takes `--groups-per-call` tasks per call and answers them in one call, with
RolloutGroups of the SmolLM2 run's shape (8 samples x 48 tokens, ids and log-probs as raw bytes, texts).

Inside the window: from the first call after the warm-up to the end of the duration; counted: groups that
reached `rollouts` (its length) and the latency of each call pair (lease + answer). Outside: registering the
workers, filling `tasks`. The two paths alternate (`--repeat` times each) so both see the same host. The
learner's consumption to compare with: the demo's async run (benchmarks/results/async_vs_sync/summary.json:
steps/h x groups_per_step), the fastest consumer measured here.

Results: benchmarks/results/work_throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import redis
import redis.asyncio as aioredis
import uvloop

from benchmarks.load_heartbeat import Connection, cpu_seconds, own_cpu_seconds, percentile, register_workers
from cluster.ports import free_port
from cluster.redis_server import RedisServer
from shared.keys import RunKeys
from shared.messages import RolloutGroup, TaskGroup
from shared.run_file import read_run_file
from shared.streams import ROLLOUTS, TASKS
from shared.work_api import LEASE_PATH, MSGPACK_CONTENT_TYPE, ROLLOUTS_PATH, SubmittedGroup, WorkSubmission

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "work_throughput.json"
RUN_ID = "work"
RUN_TOML = """\
run_id = "work"
[rollout]
heartbeat_interval_s = 30.0
claim_idle_ms = 600000
[coordinator]
lease_s = 600.0
[activation]
enabled = false
# 1,000 simulated workers under open registration are one credential (the shared identity), and no reward
# service scores their groups: the ceiling of the path, with its per-credential budget and earning out of the way
[credentials]
max_workers = 100000
max_leases = 1000000
registrations_per_min = 1e7
registrations_per_min_per_address = 1e7
[work]
earn_leases = false
"""
GROUP_SIZE = 8
NEW_TOKENS = 48
REQUEST_TIMEOUT_S = 30.0
FIELD = b"data"  # shared/bus.py's entry field


@dataclass
class Stats:
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    measuring: bool = False

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def task(index: int) -> TaskGroup:
    return TaskGroup(
        run_id=RUN_ID,
        task_id=f"t{index:08d}",
        task_name="chain_sum",
        prompt=f"State the final answer to the following arithmetic problem: {index % 97} + {index % 89} =",
        num_samples=GROUP_SIZE,
        max_new_tokens=NEW_TOKENS,
        temperature=0.7,
    )


def rollout(task_id: str, worker_id: str) -> RolloutGroup:
    """A group of the SmolLM2 run's shape for `task_id`."""
    rng = np.random.default_rng(abs(hash(task_id)) % 2**32)
    return RolloutGroup(
        run_id=RUN_ID,
        group_id=uuid.uuid4().hex,
        task_id=task_id,
        task_name="chain_sum",
        prompt="State the final answer to the following arithmetic problem: 12 + 30 =",
        worker_id=worker_id,
        policy_version=3,
        temperature=0.7,
        prompt_token_ids=rng.integers(0, 49152, 40, dtype=np.int32).tobytes(),
        completion_token_ids=rng.integers(0, 49152, GROUP_SIZE * NEW_TOKENS, dtype=np.int32).tobytes(),
        completion_lengths=np.full(GROUP_SIZE, NEW_TOKENS, dtype=np.int32).tobytes(),
        behaviour_logprobs=rng.normal(-1.0, 0.5, GROUP_SIZE * NEW_TOKENS).astype(np.float32).tobytes(),
        completion_texts=["12 + 30 = 42. The final answer is 42."] * GROUP_SIZE,
        finish_reasons=["stop"] * GROUP_SIZE,
        generation_s=1.0,
    )


def fill_tasks(redis_url: str, num_tasks: int) -> None:
    """The reward service's part, before the clock: `num_tasks` tasks on `tasks` and its consumer group."""
    client = redis.Redis.from_url(redis_url)
    stream = RunKeys(RUN_ID).name_of(TASKS)
    client.xgroup_create(stream, TASKS.group, id="0", mkstream=True)
    for start in range(0, num_tasks, 2000):
        pipe = client.pipeline(transaction=False)
        for index in range(start, min(num_tasks, start + 2000)):
            pipe.xadd(stream, {FIELD: task(index).encode()})
        pipe.execute()
    client.close()


def rollouts_length(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.xlen(RunKeys(RUN_ID).name_of(ROLLOUTS)))
    finally:
        client.close()


# the path before: each worker on Redis itself, as services/rollout/worker.py did through shared/bus.py
async def redis_worker(worker_id: str, redis_url: str, per_call: int, end_at: float, stats: Stats) -> None:
    keys = RunKeys(RUN_ID)
    tasks_stream, rollouts_stream = keys.name_of(TASKS), keys.name_of(ROLLOUTS)
    client = aioredis.Redis.from_url(redis_url, max_connections=1)
    try:
        while time.monotonic() < end_at:
            started = time.monotonic()
            try:
                answer = await client.xreadgroup(TASKS.group, worker_id, {tasks_stream: ">"}, count=per_call)
                entries = answer[0][1] if answer else []
                if not entries:
                    stats.error("no tasks")
                    await asyncio.sleep(0.05)
                    continue
                pipe = client.pipeline(transaction=True)
                for entry_id, fields in entries:
                    leased = TaskGroup.decode(fields[FIELD])
                    pipe.xadd(rollouts_stream, {FIELD: rollout(leased.task_id, worker_id).encode()})
                    pipe.xack(tasks_stream, TASKS.group, entry_id)
                await pipe.execute()
            except (redis.RedisError, OSError) as exc:
                stats.error(type(exc).__name__)
                continue
            if stats.measuring:
                stats.latencies_s.append(time.monotonic() - started)
    finally:
        await client.aclose()


# the path now: the coordinator's work API
class HttpConnection(Connection):
    """load_heartbeat's keep-alive connection, posting a body and answering (status, body)."""

    async def post(self, path: str, token: str, content_type: str, body: bytes) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        status = await self.request(head + body, REQUEST_TIMEOUT_S)
        return status, self.body


async def api_worker(worker_id: str, token: str, port: int, per_call: int, end_at: float, stats: Stats) -> None:
    connection = await HttpConnection.open(port)
    lease_body = json.dumps({"max_groups": per_call}).encode()
    try:
        while time.monotonic() < end_at:
            started = time.monotonic()
            try:
                status, body = await connection.post(LEASE_PATH, token, "application/json", lease_body)
                if status != 200:
                    stats.error(f"lease http {status}")
                    continue
                leased = json.loads(body)["tasks"]
                if not leased:
                    stats.error("no tasks")
                    await asyncio.sleep(0.05)
                    continue
                submission = WorkSubmission(
                    run_id=RUN_ID,
                    groups=[
                        SubmittedGroup(
                            lease_id=item["lease_id"], group=rollout(item["task"]["task_id"], worker_id).encode()
                        )
                        for item in leased
                    ],
                )
                status, body = await connection.post(ROLLOUTS_PATH, token, MSGPACK_CONTENT_TYPE, submission.encode())
                if status != 200:
                    stats.error(f"submit http {status}")
                    continue
                refused = json.loads(body)["refused"]
                if refused:
                    stats.error("refused")
            except (TimeoutError, ConnectionError) as exc:
                stats.error(type(exc).__name__)
                connection.close()
                connection = await HttpConnection.open(port)
                continue
            if stats.measuring:
                stats.latencies_s.append(time.monotonic() - started)
    finally:
        connection.close()


async def drive(make_workers, duration_s: float, warmup_s: float, stats: Stats, redis_url: str) -> tuple[int, float]:
    """Runs the workers; returns (groups that reached `rollouts` inside the window, window seconds)."""
    end_at = time.monotonic() + warmup_s + duration_s
    runners = [asyncio.create_task(worker) for worker in make_workers(end_at)]
    await asyncio.sleep(warmup_s)
    stats.measuring = True
    before, started = await asyncio.to_thread(rollouts_length, redis_url), time.monotonic()
    await asyncio.gather(*runners)
    window_s = time.monotonic() - started
    return await asyncio.to_thread(rollouts_length, redis_url) - before, window_s


def measure(path: str, args: argparse.Namespace) -> dict:
    num_tasks = args.tasks
    stats = Stats()
    with tempfile.TemporaryDirectory(prefix="work-") as tmp, RedisServer(Path(tmp) / "redis") as redis_server:
        fill_tasks(redis_server.url, num_tasks)
        coordinator = None
        try:
            if path == "redis":
                names = [f"load-{i:04d}" for i in range(args.workers)]

                def make_workers(end_at: float) -> list:
                    return [redis_worker(n, redis_server.url, args.groups_per_call, end_at, stats) for n in names]

                server_pid = None
            else:
                coordinator, port = start_coordinator(Path(tmp), redis_server.url)
                workers = register_workers(f"http://127.0.0.1:{port}", args.workers)

                def make_workers(end_at: float) -> list:
                    return [
                        api_worker(worker_id, token, port, args.groups_per_call, end_at, stats)
                        for worker_id, token in workers
                    ]

                server_pid = coordinator.pid
            cpu_before = {"redis": cpu_seconds(redis_server.process.pid), "client": own_cpu_seconds()}
            if server_pid is not None:
                cpu_before["coordinator"] = cpu_seconds(server_pid)
            num_groups, window_s = uvloop.run(
                drive(make_workers, args.duration_s, args.warmup_s, stats, redis_server.url)
            )
            cpu = {
                "redis": (cpu_seconds(redis_server.process.pid) - cpu_before["redis"]),
                "client": own_cpu_seconds() - cpu_before["client"],
            }
            if server_pid is not None:
                cpu["coordinator"] = cpu_seconds(server_pid) - cpu_before["coordinator"]
        finally:
            if coordinator is not None:
                coordinator.terminate()
                coordinator.wait(timeout=20)
    wall_s = args.warmup_s + args.duration_s
    latencies_ms = [1000 * s for s in stats.latencies_s] or [float("nan")]
    return {
        "path": path,
        "workers": args.workers,
        "groups_per_call": args.groups_per_call,
        "window_s": round(window_s, 2),
        "groups_per_s": round(num_groups / window_s, 1),
        "call_pairs_measured": len(stats.latencies_s),
        "latency_ms": {
            "p50": round(statistics.median(latencies_ms), 2),
            "p99": round(percentile(latencies_ms, 0.99), 2),
            "max": round(max(latencies_ms), 2),
        },
        "errors": stats.errors,
        "cpu_cores": {name: round(seconds / wall_s, 2) for name, seconds in cpu.items()},
    }


def start_coordinator(tmp: Path, redis_url: str) -> tuple[subprocess.Popen, int]:
    run_file = tmp / "run.toml"
    run_file.write_text(RUN_TOML)
    port = free_port()
    env = {
        **os.environ,
        "RL_ADMIN_TOKEN": secrets.token_urlsafe(24),
        "RL_OPEN_REGISTRATION": "true",  # the benchmark registers its simulated fleet without a token
        "RL_REDIS_URL": redis_url,
        "RL_RUN_CONFIG": str(run_file),
        "RL_COORDINATOR_PORT": str(port),
        "RL_LOG_LEVEL": "WARNING",
    }
    log_path = tmp / "coordinator.log"
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "services.coordinator"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log_path, "wb"),
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return coordinator, port
        except httpx.HTTPError:
            pass
        if coordinator.poll() is not None or time.monotonic() > deadline:
            coordinator.kill()
            coordinator.wait()
            sys.exit("the coordinator did not start:\n" + log_path.read_text()[-3000:])
        time.sleep(0.2)


def learner_groups_per_s() -> float | None:
    """The demo learner's consumption in its async run (the fastest measured here), groups/s."""
    summary = REPO_ROOT / "benchmarks" / "results" / "async_vs_sync" / "summary.json"
    demo = REPO_ROOT / "configs" / "demo.toml"
    if not summary.exists():
        return None

    groups_per_step = read_run_file(demo)["grpo"]["groups_per_step"]
    rows = {row["run"]: row for row in json.loads(summary.read_text())["rows"]}
    return rows["async S=2"]["steps_per_hour"] / 3600.0 * groups_per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--groups-per-call", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=200_000, help="tasks put on `tasks` before the clock")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs = []
    for index in range(args.repeat):
        for path in ("redis", "work_api"):
            result = measure(path, args)
            print(f"[{index + 1}/{args.repeat}] {json.dumps(result)}", flush=True)
            runs.append(result)
    by_path = {p: [r["groups_per_s"] for r in runs if r["path"] == p] for p in ("redis", "work_api")}
    consumed = learner_groups_per_s()
    summary = {
        "command": "python -m benchmarks.work_throughput " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "groups_per_s_median": {p: statistics.median(v) for p, v in by_path.items()},
        "work_api_over_redis": round(statistics.median(by_path["work_api"]) / statistics.median(by_path["redis"]), 3),
        "learner_groups_per_s": None if consumed is None else round(consumed, 1),
        "runs": runs,
    }
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
