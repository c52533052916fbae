"""Decode bombs against the work API: what one costs the coordinator, and how its other requests fare meanwhile.

    python -m benchmarks.decode_bomb                                   # this tree
    python -m benchmarks.decode_bomb --before /tmp/decode-bomb-before  # and an older tree, side by side

A registered worker may send POST /v1/work/rollouts a body of up to 16 MiB (the run here is a model folder's,
whose body limit is that ceiling: shared/work_api.py max_submission_bytes). Each tree gets a private
redis-server and its own coordinator process (`python -m services.coordinator`, stopped by PID), and:

(a) memory, one fresh coordinator per shape: a worker registers, one warm-up submission and a few GET
    /v1/status run, then the coordinator's peak RSS is reset (/proc/<pid>/clear_refs) and ONE 16 MiB body of
    that shape is sent. Reported: its answer, its wall time, the coordinator CPU it cost, and the peak extra
    RSS = VmHWM after the answer - VmRSS just before the body (what the request added at its worst: the
    received body, whatever its decoding built, the interpreter's and allocator's own growth), and the RSS
    left after it (memory the allocator kept). Shapes: one array of ~16.7M empty maps (the issue's bomb);
    16.7M nested one-element arrays; a 16 MiB run_id string; a well-formed submission whose 4 groups are each a
    4 MiB array of empty maps; 4 groups of 4 strings of ~1 MiB that Python stores in 4 bytes a character (the
    most a group can decode to within the limits of a lease with no task); and, for scale, an honest-shaped
    ~16 MiB submission (5 groups of ~3 MiB: 64 samples x 4,096 tokens). Groups answer leases that hold no
    task: each is decoded (within the limits of any task, after the change), then refused.
(b) latency, one fresh coordinator: GET /v1/status polled back to back on one keep-alive connection for
    `duration_s` with no other load, then for `duration_s` while `senders` processes (each its own registered
    worker) repeat the issue's bomb. Reported: the polls' p50 / p99 / max and count in each window (every poll
    that started inside it; a poll's time is its whole round trip, queueing in the coordinator included), the
    bombs answered and their statuses, the coordinator's CPU and peak RSS over the bomb window.

Outside the windows: starting Redis and the coordinator, registration, the warm-up, building the bodies, and
the senders' own start-up (the bomb window opens once every sender has its body built and a connection open).
Everything shares this machine's cores: the senders' sending and the poller's polling cost CPU the coordinator
would otherwise have. Writes benchmarks/results/decode_bomb.json.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx
import msgpack

from benchmarks.result_file import write_result
from cluster.ports import free_port
from cluster.redis_server import RedisServer
from shared.messages import RolloutGroup, pack_float32, pack_int32
from shared.work_api import LEASE_PATH, MSGPACK_CONTENT_TYPE, ROLLOUTS_PATH, SubmittedGroup, WorkSubmission

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "decode_bomb.json"
RUN_ID = "bomb"
RUN_TOML = f"""\
run_id = "{RUN_ID}"
[rollout]
claim_idle_ms = 600000
[coordinator]
lease_s = 600.0
"""
BODY_BYTES = 16 * 1024 * 1024  # the route's largest body
GROUP_BYTES = 4 * 1024 * 1024  # a submitted group's largest
MSGPACK = {"Content-Type": MSGPACK_CONTENT_TYPE}
POLL_TIMEOUT_S = 30.0


# the bodies


def array_of_empty_maps(num_bytes: int) -> bytes:
    """One msgpack array of ~num_bytes empty maps (fixmap 0x80, one byte each): ~72 bytes of Python objects per
    byte sent, to a decoder without limits."""
    count = num_bytes - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def deep_nesting(num_bytes: int) -> bytes:
    return b"\x91" * (num_bytes - 1) + b"\xc0"


def huge_run_id(num_bytes: int) -> bytes:
    """A WorkSubmission's map whose run_id is a string of almost all the body."""
    length = num_bytes - 13  # after a map's, a key's and a string's headers
    return b"\x81\xa6run_id\xdb" + length.to_bytes(4, "big") + b"r" * length


def submission_of(groups: list[bytes]) -> bytes:
    answers = [SubmittedGroup(lease_id=f"1-{index}", group=group) for index, group in enumerate(groups)]
    return WorkSubmission(run_id=RUN_ID, groups=answers).encode()


def group_bombs(num_bytes: int) -> bytes:
    return submission_of([array_of_empty_maps(GROUP_BYTES - 64)] * (num_bytes // GROUP_BYTES))


def wide_strings(num_bytes: int) -> bytes:
    """4 groups of 4 strings of ~1 MiB, each ASCII but for one character outside the BMP: Python stores every
    character of such a string in 4 bytes, so each group decodes to ~4x its bytes, within every decode limit."""
    text = msgpack.packb("a" * (GROUP_BYTES // 4 - 64) + "\U0001f600")
    group = b"\x81\xb0completion_texts\x94" + text * 4
    return submission_of([group] * (num_bytes // GROUP_BYTES))


def honest_groups(num_bytes: int) -> bytes:
    """Well-formed groups of 64 samples x 4,096 tokens (4 bytes of text per token, ~3 MiB each), ~num_bytes in all."""
    num_samples, num_tokens = 64, 4096
    group = RolloutGroup(
        run_id=RUN_ID,
        group_id="g" * 32,
        task_id="t" * 32,
        task_name="arithmetic_mod10",
        prompt="1+2=",
        worker_id="w" * 32,
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32(range(64)),
        completion_token_ids=pack_int32([7] * (num_samples * num_tokens)),
        completion_lengths=pack_int32([num_tokens] * num_samples),
        behaviour_logprobs=pack_float32([-1.0] * (num_samples * num_tokens)),
        completion_texts=["x" * (4 * num_tokens)] * num_samples,
        finish_reasons=["length"] * num_samples,
        generation_s=1.0,
    ).encode()
    return submission_of([group] * ((num_bytes - 64 * 1024) // len(group)))


SHAPES: dict[str, Callable[[int], bytes]] = {
    "one array of empty maps": array_of_empty_maps,
    "nested one-element arrays": deep_nesting,
    "a 16 MiB string": huge_run_id,
    "4 groups, each a 4 MiB array of empty maps": group_bombs,
    "4 groups of wide strings (the most a group decodes to within the limits)": wide_strings,
    "honest-shaped groups (for scale)": honest_groups,
}
WORST = "one array of empty maps"


# the coordinator


@dataclass(frozen=True)
class Coordinator:
    url: str
    pid: int
    admin_token: str = ""


@contextlib.contextmanager
def running_coordinator(
    tree: Path, run_toml: str = RUN_TOML, env_extra: dict[str, str] | None = None
) -> Iterator[Coordinator]:
    """A private redis-server and `tree`'s coordinator on it, running `run_toml` with open registration (unless
    `env_extra` says otherwise), until the block ends (then stopped by PID). `Coordinator.admin_token` is its
    admin token."""
    with tempfile.TemporaryDirectory(prefix="decode-bomb-") as tmp, RedisServer(Path(tmp) / "redis") as redis_server:
        run_file = Path(tmp) / "run.toml"
        run_file.write_text(run_toml)
        port = free_port()
        admin_token = secrets.token_urlsafe(24)
        env = {
            **os.environ,
            "RL_ADMIN_TOKEN": admin_token,
            "RL_OPEN_REGISTRATION": "true",
            "RL_REDIS_URL": redis_server.url,
            "RL_RUN_CONFIG": str(run_file),
            "RL_COORDINATOR_PORT": str(port),
            "RL_LOG_LEVEL": "WARNING",
            **(env_extra or {}),
        }
        log_path = Path(tmp) / "coordinator.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.coordinator"], cwd=tree, env=env, stdout=log, stderr=log
            )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_serving(url, process, log_path)
            yield Coordinator(url, process.pid, admin_token)
        finally:
            process.terminate()
            process.wait(timeout=30)


def wait_until_serving(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit("the coordinator did not start:\n" + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.2)


def register(url: str, name: str) -> str:
    """A worker's bearer token."""
    response = httpx.post(url + "/v1/workers", json={"name": name, "price_per_hour": 0.0}, timeout=30)
    response.raise_for_status()
    return str(response.json()["token"])


def proc_status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak_rss(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


# (a) one bomb of each shape


def one_bomb(tree: Path, shape: str) -> dict[str, Any]:
    body = SHAPES[shape](BODY_BYTES)
    with running_coordinator(tree) as coordinator:
        token = register(coordinator.url, "bomber")
        with httpx.Client(base_url=coordinator.url, timeout=120, headers={"Authorization": f"Bearer {token}"}) as http:
            http.post(LEASE_PATH, json={"max_groups": 1})  # creates the tasks' group (none is queued)
            http.post(ROLLOUTS_PATH, content=submission_of([b"warm-up"]), headers=MSGPACK)  # lazy imports, pools
            for _ in range(3):
                http.get("/v1/status")
            time.sleep(0.5)  # let the warm-up's garbage settle: what follows is the bomb's alone
            rss_before_kib = proc_status_kib(coordinator.pid, "VmRSS")
            reset_peak_rss(coordinator.pid)
            cpu_before, started = cpu_s(coordinator.pid), time.monotonic()
            response = http.post(ROLLOUTS_PATH, content=body, headers=MSGPACK)
            wall_s, cpu = time.monotonic() - started, cpu_s(coordinator.pid) - cpu_before
            peak_kib = proc_status_kib(coordinator.pid, "VmHWM")
            rss_after_kib = proc_status_kib(coordinator.pid, "VmRSS")
    return {
        "body_bytes": len(body),
        "status": response.status_code,
        "answer": response.text[:300],
        "wall_s": round(wall_s, 3),
        "coordinator_cpu_s": round(cpu, 3),
        "rss_before_mib": round(rss_before_kib / 1024, 1),
        "peak_extra_rss_mib": round((peak_kib - rss_before_kib) / 1024, 1),
        "rss_left_after_mib": round((rss_after_kib - rss_before_kib) / 1024, 1),
    }


# (b) GET /v1/status while bombs arrive


def send_bombs(url: str, token: str, ready: Event, start: Event, stop: Event, results: Any) -> None:
    """One sender process: build the bomb, connect, then repeat it from `start` until `stop`."""
    body = array_of_empty_maps(BODY_BYTES)
    statuses: list[int] = []
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"}) as http:
        http.get("/healthz")
        ready.set()
        start.wait()
        while not stop.is_set():
            try:
                statuses.append(http.post(ROLLOUTS_PATH, content=body, headers=MSGPACK).status_code)
            except httpx.HTTPError:
                statuses.append(0)
    results.put(statuses)


def poll_status(url: str, duration_s: float) -> list[float]:
    """Latencies (s) of GET /v1/status sent back to back for `duration_s` (a timeout counts as its limit)."""
    latencies = []
    with httpx.Client(base_url=url, timeout=POLL_TIMEOUT_S) as http:
        http.get("/v1/status")
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                ok = http.get("/v1/status").status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.monotonic() - started if ok else POLL_TIMEOUT_S)
    return latencies


def latency_summary(latencies_s: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies_s)

    def ms(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"num_polls": len(ordered), "p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": round(1000 * ordered[-1], 1)}


def status_under_bombs(tree: Path, num_senders: int, duration_s: float) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    with running_coordinator(tree) as coordinator:
        tokens = [register(coordinator.url, f"bomber-{index}") for index in range(num_senders)]
        quiet = latency_summary(poll_status(coordinator.url, duration_s))
        start, stop, results = spawn.Event(), spawn.Event(), spawn.Queue()
        readies = [spawn.Event() for _ in tokens]
        senders = [
            spawn.Process(target=send_bombs, args=(coordinator.url, token, ready, start, stop, results))
            for token, ready in zip(tokens, readies, strict=True)
        ]
        for sender in senders:
            sender.start()
        for ready in readies:
            ready.wait(timeout=120)
        rss_before_kib = proc_status_kib(coordinator.pid, "VmRSS")
        reset_peak_rss(coordinator.pid)
        cpu_before = cpu_s(coordinator.pid)
        start.set()
        under_bombs = latency_summary(poll_status(coordinator.url, duration_s))
        stop.set()
        cpu = cpu_s(coordinator.pid) - cpu_before
        peak_kib = proc_status_kib(coordinator.pid, "VmHWM")
        statuses = [status for _ in senders for status in results.get(timeout=300)]
        for sender in senders:
            sender.join(timeout=60)
    return {
        "without_bombs": quiet,
        "with_bombs": under_bombs
        | {
            "num_bombs_answered": len(statuses),
            "bomb_statuses": {str(code): statuses.count(code) for code in sorted(set(statuses))},
            "coordinator_cpu_s": round(cpu, 2),
            "peak_extra_rss_mib": round((peak_kib - rss_before_kib) / 1024, 1),
        },
    }


def measure(tree: Path, num_senders: int, duration_s: float) -> dict[str, Any]:
    memory = {}
    for shape in SHAPES:
        print(f"  {tree}: one bomb, {shape}", flush=True)
        memory[shape] = one_bomb(tree, shape)
        print(f"    {memory[shape]}", flush=True)
    print(
        f"  {tree}: GET /v1/status, {duration_s:.0f}s quiet then {duration_s:.0f}s under {num_senders} senders",
        flush=True,
    )
    latency = status_under_bombs(tree, num_senders, duration_s)
    print(f"    {latency}", flush=True)
    return {"tree": str(tree), "commit": commit_of(tree), "one_bomb": memory, "status_latency": latency}


def commit_of(tree: Path) -> str:
    result = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True).stdout
    return result.stdout.strip() + (" + uncommitted changes" if dirty.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decode_bomb",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--before", type=Path, help="an older tree (a git worktree) measured first, the same way")
    parser.add_argument(
        "--after", type=Path, default=REPO_ROOT, help="the tree measured as 'after' (default: this one)"
    )
    parser.add_argument("--senders", type=int, default=4, help="processes repeating the bomb in the latency window")
    parser.add_argument("--duration-s", type=float, default=20.0, help="each latency window")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    trees = {"before": args.before, "after": args.after} if args.before else {"after": args.after}
    measured = {}
    for name, tree in trees.items():
        print(f"{name}: {tree}", flush=True)
        measured[name] = measure(tree.resolve(), args.senders, args.duration_s)
    result = {
        "command": "python -m benchmarks.decode_bomb " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores shared by redis, the coordinator, the senders "
        "and the poller",
        "target": "one 16 MiB bomb peaks below 64 MiB of extra coordinator RSS; GET /v1/status p99 < 1 s under the "
        "bomb stream",
        "windows": __doc__.split("(a) ", 1)[1].split("\nEverything shares", 1)[0],
        **measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
