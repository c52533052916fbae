"""Sybil identities against a real local cluster: what one operator can take from the run by registering many
identities (issue 35), each attack beside the same cluster without it, in one session.

    python -m benchmarks.sybil_fleet [--cells baseline,hoard-20,...] [--window-s 60] [--label after]

Every cell is a fresh local cluster (cluster/local.py) of benchmarks/sybil_fleet.toml (the demo's run file, given
5,000 steps) with 3 honest torch workers on the cluster's shared join token. Once the learner has taken
WARMUP_STEPS steps, the window opens: the attacker process starts (benchmarks/sybil_attacker.py, asyncio, the
REST API only, with join credentials the admin issued for it), and the window closes `--window-s` later; then
the cluster stops. The attacker runs at the lowest priority (nice 19): on a real deployment its own CPU is
another machine's, so here it takes only cycles the cluster leaves idle, and what it costs the cluster is the
coordinator's work answering it (each cell records the cores every service used, and the attacker's CPU; a
200-identity attacker alone needs ~0.5 core, which at normal priority the learner lost on these 2 cores).
The cells:

    baseline        no attacker (also baseline-2, baseline-3, baseline-again: one before and after every two
                    attacks, whose ratios are taken against the mean of their two neighbours)
    hoard-20        20 identities under one credential, each leasing 16 and never answering
    hoard-200       200 identities under one credential, the same
    spread-20       200 identities spread over 20 credentials, from one address
    hit-and-run     identities that register, lease 16 and vanish, one after another, under one credential
    slow-garbage    20 identities under one credential answering every lease with signed garbage 1 s before it
                    runs out (the work API accepts it, the reward service refuses it)
    bombs           4 identities posting 16 MiB decode bombs back to back
    newcomer        no attacker: a 4th honest worker joins when the window opens, and its allowance and leases
                    are read from Redis every 0.1 s for the window (the allowance curve of a new honest worker)

Measured in the window (inside: from the attacker's start to `--window-s` later; outside: the cluster's start,
its warm-up and its stop): learner steps/min (its version at the close minus at the open), the groups the
work API accepted from the honest workers, GET /v1/status latency (polled every 0.25 s), and what was flagged
and quarantined, and when (seconds after the attacker started; from GET /v1/status and /v1/operators each
second). After the stop: tasks lost (the work API's dead letters of tasks that holders let expire too often,
and the run accounting's unaccounted tasks, cluster/accounting.py) and honest workers flagged. Writes
benchmarks/results/sybil_fleet.json (cells of earlier labels are kept: `--label before` ran the same file on the
code before the fix).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from cluster.accounting import GroupAccounting
from cluster.local import ClusterOptions, LocalCluster

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "sybil_fleet.json"
CONFIG = REPO_ROOT / "benchmarks" / "sybil_fleet.toml"
WARMUP_STEPS = 5
STATUS_POLL_S = 0.25
HONEST_PREFIX = "worker-"
# cell -> (attacker kind, identities, credentials); None: no attacker
CELLS: dict[str, tuple[str, int, int] | None] = {
    "baseline": None,
    "hoard-20": ("hoard", 20, 1),
    "hoard-200": ("hoard", 200, 1),
    "spread-20": ("hoard", 200, 20),
    "hit-and-run": ("hit-and-run", 20, 1),
    "slow-garbage": ("garbage", 20, 1),
    "bombs": ("bombs", 4, 1),
    "baseline-2": None,
    "baseline-3": None,
    "baseline-again": None,
    "newcomer": None,
}
# the session's order: a baseline before and after every two attacks (the machine drifts by tens of percent over
# an hour), each attack's ratios taken against the mean of its neighbouring baselines
SESSION = "baseline,hoard-20,hoard-200,baseline-2,spread-20,hit-and-run,baseline-3,slow-garbage,bombs,baseline-again"
NEWCOMER = 3  # the index of the honest worker the newcomer cell starts in the window (worker-3)
ATTACKER_NICENESS = 19  # the attacker's CPU is not the cluster's (module doc)
# a task the work API dead-letters because its holders let it expire too often (messages before and after the fix)
LOST_TASK_MARKERS = ("never answered", "let it expire")


class Poller(threading.Thread):
    """GET /v1/status every STATUS_POLL_S (latency of each), and each second who is quarantined and flagged."""

    def __init__(self, url: str, admin_token: str, started_s: float) -> None:
        super().__init__(name="poller", daemon=True)
        self.url, self.admin, self.started_s = url, {"Authorization": f"Bearer {admin_token}"}, started_s
        self.stop_event = threading.Event()
        self.latencies_ms: list[float] = []
        self.first_quarantined_s: dict[str, float] = {}  # worker name -> seconds after the attacker started
        self.credentials_quarantined_s: dict[str, float] = {}
        self.honest_quarantined: set[str] = set()

    def run(self) -> None:
        next_census_s = 0.0
        with httpx.Client(base_url=self.url, timeout=10.0) as client:
            while not self.stop_event.is_set():
                began = time.perf_counter()
                try:
                    response = client.get("/v1/status")
                except httpx.HTTPError:
                    self.latencies_ms.append(10_000.0)
                    continue
                self.latencies_ms.append((time.perf_counter() - began) * 1000)
                now_s = time.monotonic() - self.started_s
                if now_s >= next_census_s and response.status_code == 200:
                    next_census_s = now_s + 1.0
                    self.census(client, response.json(), now_s)
                self.stop_event.wait(STATUS_POLL_S)

    def census(self, client: httpx.Client, status: dict[str, Any], now_s: float) -> None:
        for worker in status["workers"]:
            if worker["state"] == "quarantined":
                self.first_quarantined_s.setdefault(worker["name"], round(now_s, 1))
                if worker["name"].startswith(HONEST_PREFIX):
                    self.honest_quarantined.add(worker["name"])
        operators = client.get("/v1/operators", headers=self.admin)
        for operator in operators.json() if operators.status_code == 200 else []:
            if operator["state"] == "quarantined":
                self.credentials_quarantined_s.setdefault(operator["operator_id"], round(now_s, 1))


def run_cell(name: str, window_s: float, work_dir: Path) -> dict[str, Any]:
    attack = CELLS[name]
    run_id = f"sybil-{name}"
    shutil.rmtree(REPO_ROOT / "runs" / run_id, ignore_errors=True)
    cluster = LocalCluster(ClusterOptions(config_path=CONFIG, num_workers=3, run_id=run_id))
    attacker: subprocess.Popen[bytes] | None = None
    summary_path = work_dir / f"{name}.attacker.json"
    try:
        cluster.start()
        admin = {"Authorization": f"Bearer {cluster.admin_token}"}
        with httpx.Client(base_url=cluster.coordinator_url, timeout=10.0) as client:
            wait_for_steps(cluster, client, WARMUP_STEPS)
            tokens = [issue(client, admin, f"attacker-{i}") for i in range(attack[2] if attack else 0)]
            version_0, accepted_0 = learner_version(client), honest_accepted(client, admin)
            cpu_0 = service_cpu_s(cluster)
            started_s = time.monotonic()
            poller = Poller(cluster.coordinator_url, cluster.admin_token, started_s)
            poller.start()
            if attack is not None:
                kind, identities, _ = attack
                attacker = subprocess.Popen(
                    ["nice", "-n", str(ATTACKER_NICENESS), sys.executable, "-m", "benchmarks.sybil_attacker"]
                    + ["--kind", kind, "--identities", str(identities)]
                    + ["--url", cluster.coordinator_url, "--run-id", cluster.run.run_id, "--tokens", ",".join(tokens)]
                    + ["--lease-s", str(cluster.run.rollout.claim_idle_ms / 1000), "--duration-s", str(window_s)]
                    + ["--out", str(summary_path)],
                    cwd=REPO_ROOT,
                )
            curve = follow_newcomer(cluster, client, started_s + window_s) if name == "newcomer" else None
            while time.monotonic() < started_s + window_s:
                cluster.supervisor.poll()
                time.sleep(0.5)
            elapsed_s = time.monotonic() - started_s
            cpu_1 = service_cpu_s(cluster)
            version_1, accepted_1 = learner_version(client), honest_accepted(client, admin)
            poller.stop_event.set()
            poller.join(timeout=15)
            if attacker is not None:
                attacker.wait(timeout=60)
            flagged = client.get("/v1/work/accounting", headers=admin).json().get("flagged", {})
            names = worker_names(client)
            lost = lost_tasks(cluster)
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
            attacker.wait()
        cluster.stop()
    accounting = GroupAccounting.model_validate_json((cluster.run_dir / "accounting.json").read_text())
    return {
        "attacker": json.loads(summary_path.read_text()) if summary_path.exists() else None,
        "window_s": round(elapsed_s, 1),
        "learner_steps": version_1 - version_0,
        "learner_steps_per_min": round((version_1 - version_0) / elapsed_s * 60, 1),
        "honest_groups_accepted": accepted_1 - accepted_0,
        "status_latency_ms": percentiles(poller.latencies_ms),
        # cores each service used over the window (what an attack's requests cost the coordinator shows here)
        "service_cores": {name: round((cpu_1[name] - cpu_0.get(name, 0.0)) / elapsed_s, 2) for name in cpu_1},
        "attackers_quarantined": {
            n: s for n, s in poller.first_quarantined_s.items() if not n.startswith(HONEST_PREFIX)
        },
        "credentials_quarantined_at_s": poller.credentials_quarantined_s,
        "honest_quarantined": sorted(poller.honest_quarantined),
        "honest_flagged": sorted(names.get(w, w) for w in flagged if names.get(w, "").startswith(HONEST_PREFIX)),
        "attackers_flagged": sum(1 for w in flagged if not names.get(w, "").startswith(HONEST_PREFIX)),
        "tasks_lost": lost,
        "tasks_unaccounted": accounting.num_unaccounted,
        "tasks_unaccounted_per_worker": accounting.num_unaccounted_workers,
        **({"newcomer": curve} if curve is not None else {}),
    }


def follow_newcomer(cluster: LocalCluster, client: httpx.Client, until_s: float) -> dict[str, Any]:
    """Start worker-3 and read its allowance and leases taken every 0.1 s until `until_s` (monotonic): each rise of
    its `leased` count is one lease call's grant, at the allowance it held then."""
    import redis

    from cluster.redis_acl import OPERATOR
    from shared.keys import RunKeys
    from shared.work_counts import read_work_counts

    cluster.start_worker(NEWCOMER)
    joined_s = time.monotonic()
    name = f"worker-{NEWCOMER}"
    keys, store = RunKeys(cluster.run.run_id), redis.Redis.from_url(cluster.redis_url_for(OPERATOR))
    worker_id: str | None = None
    grants: list[list[float]] = []
    allowance_at: list[list[float | None]] = []
    leased = 0
    try:
        while time.monotonic() < until_s:
            cluster.supervisor.poll()
            if worker_id is None:
                worker_id = next((w for w, n in worker_names(client).items() if n == name), None)
            else:
                now_leased = read_work_counts(store, keys, [worker_id], held=False).workers[worker_id].leased
                stored_allowance = store.hget(keys.work_counts(worker_id), "allowance")  # lease pacing, not a count
                at_s = round(time.monotonic() - joined_s, 2)
                if now_leased > leased:
                    grants.append([at_s, now_leased - leased])
                    leased = now_leased
                allowance = float(stored_allowance) if stored_allowance is not None else None
                if not allowance_at or allowance_at[-1][1] != allowance:
                    allowance_at.append([at_s, allowance])
            time.sleep(0.1)
    finally:
        store.close()
    return {"grants_s_and_leases": grants, "allowance_s_and_value": allowance_at}


def service_cpu_s(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds (user + system) each service process used so far: coordinator, reward, learner, the workers
    together, and the machine's busy time (/proc/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {"workers": 0.0}
    for name, process in cluster.services.items():
        try:
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # restarted meanwhile
            continue
        seconds = (int(fields[11]) + int(fields[12])) / ticks
        if name.startswith("worker"):
            used["workers"] += seconds
        else:
            used[name] = seconds
    cpu = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    used["machine"] = (sum(cpu) - cpu[3] - cpu[4]) / ticks  # all but idle and iowait
    return used


def wait_for_steps(cluster: LocalCluster, client: httpx.Client, num_steps: int) -> None:
    deadline = time.monotonic() + 300
    while learner_version(client) < num_steps:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the learner did not reach step {num_steps}")
        cluster.supervisor.poll()
        time.sleep(0.5)


def learner_version(client: httpx.Client) -> int:
    learner = client.get("/v1/status").json().get("learner")
    return int(learner["learner_version"]) if learner else 0


def honest_accepted(client: httpx.Client, admin: dict[str, str]) -> int:
    counts = client.get("/v1/work/accounting", headers=admin).json()["workers"]
    names = worker_names(client)
    return sum(c["accepted"] for w, c in counts.items() if names.get(w, "").startswith(HONEST_PREFIX))


def worker_names(client: httpx.Client) -> dict[str, str]:
    """Worker id -> name of the honest workers and whoever else the listing shows (live first)."""
    return {w["worker_id"]: w["name"] for w in client.get("/v1/workers", params={"limit": 1000}).json()}


def issue(client: httpx.Client, admin: dict[str, str], name: str) -> str:
    response = client.post("/v1/operators", json={"name": name}, headers=admin)
    response.raise_for_status()
    return str(response.json()["join_token"])


def lost_tasks(cluster: LocalCluster) -> int:
    """Tasks the work API dead-lettered because their holders let them expire too often, read from `dead`."""
    import redis

    from cluster.redis_acl import OPERATOR
    from shared.bus import StreamBus
    from shared.keys import RunKeys

    client = redis.Redis.from_url(cluster.redis_url_for(OPERATOR))
    try:
        letters = StreamBus(client, RunKeys(cluster.run.run_id), service="bench").dead_letters(count=100_000)
    finally:
        client.close()
    return sum(1 for letter in letters if any(marker in letter.error for marker in LOST_TASK_MARKERS))


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(statistics.median(ordered), 1), "p99": round(at(0.99), 1), "max": round(ordered[-1], 1)}


def stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM ends the benchmark as Ctrl-C does: the running cell's cluster and attacker are stopped first."""
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default=SESSION, help="comma-separated, in order, of: " + ", ".join(CELLS))
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--label", default="after", help="the key the cells are kept under (before / after)")
    parser.add_argument(
        "--before-tree",
        type=Path,
        help="an older checkout (a git worktree): each cell runs there first, under the label 'before', then here",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    work_dir = REPO_ROOT / "runs" / "sybil-fleet"
    work_dir.mkdir(parents=True, exist_ok=True)
    for name in args.cells.split(","):
        if args.before_tree is not None:
            run_in_tree(args.before_tree, name, args.window_s, args.out.resolve())
        print(f"cell {name} ...", flush=True)
        cell = run_cell(name, args.window_s, work_dir)
        print(json.dumps(cell, indent=1), flush=True)
        results = json.loads(args.out.read_text()) if args.out.exists() else {}
        results.setdefault(args.label, {})[name] = cell
        results |= {
            "command": "python -m benchmarks.sybil_fleet " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"),
            "config": str(CONFIG.relative_to(REPO_ROOT)),
        }
        results |= summaries(results)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


def summaries(results: dict[str, Any]) -> dict[str, Any]:
    """`table`: the rows of table_rows; `table_by_cell`: the same rows by code and cell."""
    rows = table_rows(results)
    by_cell: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_cell.setdefault(row["code"], {})[row["cell"]] = row
    return {"table": rows, "table_by_cell": by_cell}


def table_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per code (before, after) and attack cell, in the order they ran: its steps/min and honest groups a
    minute as ratios of the mean of the baselines that ran just before and just after it, tasks lost, who was
    quarantined."""
    rows = []
    for label in ("before", "after"):
        cells = list(results.get(label, {}).items())
        for index, (name, cell) in enumerate(cells):
            if name.startswith("baseline") or name == "newcomer":
                continue
            neighbours = [
                next((c for n, c in reversed(cells[:index]) if n.startswith("baseline")), None),
                next((c for n, c in cells[index + 1 :] if n.startswith("baseline")), None),
            ]
            baselines = [c for c in neighbours if c is not None]
            if not baselines:
                continue
            steps = statistics.mean(c["learner_steps_per_min"] for c in baselines)
            groups = statistics.mean(c["honest_groups_accepted"] / c["window_s"] * 60 for c in baselines)
            attacker = cell["attacker"] or {}
            quarantined = cell["attackers_quarantined"]
            rows.append(
                {
                    "code": label,
                    "cell": name,
                    "steps_per_min": cell["learner_steps_per_min"],
                    "baseline_steps_per_min": round(steps, 1),
                    "steps_vs_baseline": round(cell["learner_steps_per_min"] / steps, 2),
                    "honest_groups_vs_baseline": round(
                        cell["honest_groups_accepted"] / cell["window_s"] * 60 / groups, 2
                    ),
                    "tasks_lost": cell["tasks_lost"] + cell["tasks_unaccounted"],
                    "honest_flagged_or_quarantined": len(cell["honest_flagged"]) + len(cell["honest_quarantined"]),
                    "attacker_identities": attacker.get("registrations", 0),
                    "attacker_leases": attacker.get("leased", 0),
                    "first_quarantine_s": min(quarantined.values()) if quarantined else None,
                    "credentials_quarantined": len(cell["credentials_quarantined_at_s"]),
                    "status_p99_ms": cell["status_latency_ms"].get("p99"),
                }
            )
    return rows


def run_in_tree(tree: Path, cell: str, window_s: float, out: Path) -> None:
    """One cell on an older checkout, as this file runs it there (copied in with the attacker and the run file)."""
    for name in ("sybil_fleet.py", "sybil_attacker.py", "sybil_fleet.toml"):
        shutil.copy(REPO_ROOT / "benchmarks" / name, tree / "benchmarks" / name)
    command = [sys.executable, "-m", "benchmarks.sybil_fleet", "--cells", cell, "--label", "before"]
    subprocess.run([*command, "--window-s", str(window_s), "--out", str(out)], cwd=tree, check=True)


if __name__ == "__main__":
    main()
