"""One credential registers 10,000 identities that all die (hit and run): what the coordinator answers afterwards.

    python -m benchmarks.registration_flood [--before /tmp/older-checkout] [--identities 10000]

Each tree gets a private redis-server and its own coordinator process (benchmarks/decode_bomb.py
running_coordinator: `python -m services.coordinator`, stopped by PID), a join token, and a 2 s lease, so every
identity is dead two seconds after it registered. The flooder is one admin-issued credential, whose budget (on a
tree that has budgets) is raised so that all 10,000 register: the flood a default budget lets through in 2.8
hours (60 a minute) arrives here at the client's speed. Then, with no other load:

    status      GET /v1/status, 200 polls back to back on one connection: p50 / p99 / max and the body's size
    listing     GET /v1/workers (its default page): time and size
    another     a registration with another credential (the shared join token): its status and time
    idle cost   the coordinator's CPU over 20 s of nothing but its own control loop and lease sweeps

Inside each window: only what it names (a poll's round trip, queueing in the coordinator included). Outside: the
10,000 registrations themselves (their rate is reported), the lease expiry, the coordinator's start. Everything
shares this machine's cores. Writes benchmarks/results/registration_flood.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.decode_bomb import commit_of, cpu_s, latency_summary, running_coordinator
from benchmarks.result_file import write_result

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "registration_flood.json"
LEASE_S = 2.0
CONCURRENCY = 16
NUM_POLLS = 200
IDLE_WINDOW_S = 20.0


def run_toml(tree: Path, identities: int) -> str:
    """The run file for `tree`: a 2 s lease; registration limits out of the way, in the sections that tree knows
    (an older tree had one bucket for everyone in [coordinator]; this one a budget per credential)."""
    coordinator = f"[coordinator]\nlease_s = {LEASE_S}\ndead_worker_retention_s = 86400\n"
    if "class CredentialConfig" in (tree / "shared" / "config.py").read_text():
        credentials = f"[credentials]\nmax_workers = {identities + 8}\nregistrations_per_min = 1e7\n"
        return f'run_id = "flood"\n{coordinator}{credentials}'
    return f'run_id = "flood"\n{coordinator}registrations_per_s = 1e6\nregistration_burst = 1000000\n'


async def flood(url: str, join_token: str, identities: int) -> tuple[int, dict[int, int]]:
    """Register `identities` with `join_token`, CONCURRENCY at a time; returns (registered, refusals by status)."""
    registered = 0
    refused: dict[int, int] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(identities):
        queue.put_nowait(index)

    async def one_client() -> None:
        nonlocal registered
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while not queue.empty():
                index = queue.get_nowait()
                response = await http.post(
                    "/v1/workers", json={"name": f"sybil-{index}"}, headers={"X-RL-Join-Token": join_token}
                )
                if response.status_code == 201:
                    registered += 1
                else:
                    refused[response.status_code] = refused.get(response.status_code, 0) + 1

    await asyncio.gather(*(one_client() for _ in range(CONCURRENCY)))
    return registered, refused


def measure(tree: Path, identities: int) -> dict[str, Any]:
    shared_token = secrets.token_urlsafe(24)
    env = {"RL_OPEN_REGISTRATION": "false", "RL_JOIN_TOKEN": shared_token}
    with running_coordinator(tree, run_toml(tree, identities), env) as coordinator:
        admin = {"Authorization": f"Bearer {coordinator.admin_token}"}
        issued = httpx.post(coordinator.url + "/v1/operators", json={"name": "flooder"}, headers=admin, timeout=30)
        issued.raise_for_status()
        started = time.monotonic()
        registered, refused = asyncio.run(flood(coordinator.url, issued.json()["join_token"], identities))
        flood_s = time.monotonic() - started
        time.sleep(LEASE_S + 2.0)  # every identity's lease has run out
        with httpx.Client(base_url=coordinator.url, timeout=60) as http:
            http.get("/v1/status")
            latencies, sizes = [], []
            for _ in range(NUM_POLLS):
                began = time.monotonic()
                response = http.get("/v1/status")
                latencies.append(time.monotonic() - began)
                sizes.append(len(response.content))
            began = time.monotonic()
            listing = http.get("/v1/workers")
            listing_s = time.monotonic() - began
            began = time.monotonic()
            another = http.post("/v1/workers", json={"name": "honest"}, headers={"X-RL-Join-Token": shared_token})
            another_s = time.monotonic() - began
        cpu_before = cpu_s(coordinator.pid)
        time.sleep(IDLE_WINDOW_S)
        idle_cpu = cpu_s(coordinator.pid) - cpu_before
    return {
        "tree": str(tree),
        "commit": commit_of(tree),
        "registered": registered,
        "refused": {str(code): n for code, n in sorted(refused.items())},
        "registrations_per_s": round(registered / flood_s, 1),
        "status": latency_summary(latencies) | {"bytes": max(sizes)},
        "workers_listing": {
            "ms": round(1000 * listing_s, 1),
            "bytes": len(listing.content),
            "entries": len(listing.json()),
        },
        "another_credential_registers": {"status": another.status_code, "ms": round(1000 * another_s, 1)},
        "coordinator_idle_cpu_fraction": round(idle_cpu / IDLE_WINDOW_S, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.registration_flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--before", type=Path, help="an older tree (a git worktree) measured first, the same way")
    parser.add_argument("--identities", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    trees = {"before": args.before, "after": REPO_ROOT} if args.before else {"after": REPO_ROOT}
    measured = {}
    for name, tree in trees.items():
        print(f"{name}: {tree}", flush=True)
        measured[name] = measure(tree.resolve(), args.identities)
        print(f"  {measured[name]}", flush=True)
    result = {
        "command": "python -m benchmarks.registration_flood " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores shared by redis, the coordinator and the client",
        "target": "after 10,000 registrations of one credential: GET /v1/status < 50 ms and < 64 KiB; another "
        "credential's registration not refused",
        "identities": args.identities,
        **measured,
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
