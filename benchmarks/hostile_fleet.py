"""The demo run with two hostile workers beside the honest ones, and the task accounting at its end.

    python -m benchmarks.hostile_fleet [--config benchmarks/hostile_fleet.toml] [--workers 2]

A real local cluster (cluster/local.py) runs the run file to its last step with `--workers` honest workers.
Two more workers join over REST with the cluster's join token and use the work API as a hostile worker can:
    dropper    leases up to 8 tasks at a time and never answers (it keeps heartbeating): before the work
               API a worker that acked without posting took half of all tasks and none were reissued
    replayer   answers every task it leases twice, with two different groups (a well-formed group of garbage
               tokens, signed with its own rollout key): the second answer must be refused
At the stop the runner writes runs/<id>/accounting.json (cluster/accounting.py); this adds the work API's
per-worker counters (GET /v1/work/accounting) and writes both to benchmarks/results/hostile_fleet.json, with
the learner's run time beside that of the same run file with the honest workers only, run just before
(`--no-baseline` skips it).
Required: 0 tasks unaccounted, in total and per worker; the dropper flagged; every second answer refused.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from pathlib import Path

import httpx

from cluster.local import ClusterOptions, LocalCluster
from engines.interface import Sample
from services.rollout.rollout_groups import build_rollout_group
from shared.api import RegisterWorkerResponse
from shared.messages import TaskGroup
from shared.rollout_mac import sign_rollout
from shared.work_api import (
    ACCOUNTING_PATH,
    LEASE_PATH,
    MSGPACK_CONTENT_TYPE,
    ROLLOUTS_PATH,
    LeaseResponse,
    SubmitResponse,
    SubmittedGroup,
    WorkAccounting,
    WorkSubmission,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "hostile_fleet.json"
HEARTBEAT_EVERY_S = 1.0


class HostileWorker(threading.Thread):
    def __init__(self, kind: str, base_url: str, join_token: str, run_id: str, stop: threading.Event) -> None:
        super().__init__(name=kind, daemon=True)
        self.kind, self.base_url, self.join_token, self.run_id, self.stop_event = (
            kind,
            base_url,
            join_token,
            run_id,
            stop,
        )
        self.num_leased = self.num_first_accepted = self.num_second_refused = self.num_second_accepted = 0
        self.worker_id = ""

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=10.0) as client:
            registration = RegisterWorkerResponse.model_validate(
                client.post("/v1/workers", json={"name": self.kind}, headers={"X-RL-Join-Token": self.join_token})
                .raise_for_status()
                .json()
            )
            self.worker_id = registration.worker_id
            client.headers["Authorization"] = f"Bearer {registration.token}"
            key = bytes.fromhex(registration.access.rollout_key_hex)
            beat_at = 0.0
            while not self.stop_event.is_set():
                if time.monotonic() >= beat_at:
                    client.post(f"/v1/workers/{self.worker_id}/heartbeat", json={"policy_version": 0})
                    beat_at = time.monotonic() + HEARTBEAT_EVERY_S
                try:
                    response = client.post(LEASE_PATH, json={"max_groups": 8})
                except httpx.HTTPError:
                    break  # the cluster is stopping
                if response.status_code != 200:
                    self.stop_event.wait(0.2)
                    continue
                leased = LeaseResponse.model_validate_json(response.content).tasks
                self.num_leased += len(leased)
                if self.kind == "replayer" and leased:
                    self.answer_twice(client, leased, key)
                self.stop_event.wait(0.2)

    def answer_twice(self, client: httpx.Client, leased: list, key: bytes) -> None:
        headers = {"Content-Type": MSGPACK_CONTENT_TYPE}
        replies = []
        for _ in range(2):  # two different answers (fresh group ids): an identical retry would be accepted once
            answers = [SubmittedGroup(lease_id=item.lease_id, group=self.group(item.task, key)) for item in leased]
            body = WorkSubmission(run_id=self.run_id, groups=answers).encode()
            reply = client.post(ROLLOUTS_PATH, content=body, headers=headers)
            replies.append(SubmitResponse.model_validate_json(reply.content))
        first, second = replies
        self.num_first_accepted += len(first.accepted)
        self.num_second_accepted += len(second.accepted)
        self.num_second_refused += len(second.refused)

    def group(self, task: TaskGroup, key: bytes) -> bytes:
        """A well-formed, signed group of garbage: one token per sample."""
        garbage = Sample(prompt_token_ids=[1, 2], token_ids=[3], logprobs=[-1.0], text="7", finish_reason="length")
        group = build_rollout_group(task, [garbage] * task.num_samples, self.worker_id, 0, 0.01)
        return sign_rollout(group, key).encode()


RUN_ID = "hostile-fleet"
BASELINE_RUN_ID = "hostile-fleet-baseline"


def fresh_cluster(config: Path, num_workers: int, run_id: str) -> LocalCluster:
    """A cluster for a fresh run (the runner resumes a run whose folder exists: it is removed first)."""
    runs_dir = REPO_ROOT / "runs"
    shutil.rmtree(runs_dir / run_id, ignore_errors=True)
    return LocalCluster(ClusterOptions(config_path=config, num_workers=num_workers, runs_dir=runs_dir, run_id=run_id))


def learner_outcome(cluster: LocalCluster) -> dict[str, object]:
    """What the learner reached and how long it took (its run time: from its start to its last step)."""
    summary = json.loads((cluster.run_dir / "learner_summary.json").read_text())
    return {key: summary[key] for key in ("num_steps", "stop_reason", "wall_s", "reward_mean_last")}


def run_baseline(config: Path, num_workers: int) -> dict[str, object]:
    """The same run file with the honest workers only, just before: the speed the hostile run is compared with."""
    cluster = fresh_cluster(config, num_workers, BASELINE_RUN_ID)
    try:
        cluster.start()
        cluster.wait_until_done()
    finally:
        cluster.stop()
    return learner_outcome(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "benchmarks" / "hostile_fleet.toml")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without hostile workers")
    args = parser.parse_args()
    baseline = None if args.no_baseline else run_baseline(args.config, args.workers)
    cluster = fresh_cluster(args.config, args.workers, RUN_ID)
    stop = threading.Event()
    hostile: list[HostileWorker] = []
    work: WorkAccounting | None = None
    try:
        cluster.start()
        hostile = [
            HostileWorker(kind, cluster.coordinator_url, cluster.join_token, cluster.run.run_id, stop)
            for kind in ("dropper", "replayer")
        ]
        for worker in hostile:
            worker.start()
        cluster.wait_until_done()
        stop.set()
        for worker in hostile:
            worker.join(timeout=15)
        admin = {"Authorization": f"Bearer {cluster.admin_token}"}
        work = WorkAccounting.model_validate_json(
            httpx.get(cluster.coordinator_url + ACCOUNTING_PATH, headers=admin, timeout=10).content
        )
    finally:
        stop.set()
        cluster.stop()
    accounting = json.loads((cluster.run_dir / "accounting.json").read_text())
    names = {worker.worker_id: worker.kind for worker in hostile}
    result = {
        "command": "python -m benchmarks.hostile_fleet",
        "date": time.strftime("%Y-%m-%d"),
        "run_file": str(args.config.relative_to(REPO_ROOT) if args.config.is_relative_to(REPO_ROOT) else args.config),
        "honest_workers": args.workers,
        "hostile": {
            worker.kind: {
                "worker_id": worker.worker_id,
                "leased": worker.num_leased,
                "first_answers_accepted": worker.num_first_accepted,
                "second_answers_refused": worker.num_second_refused,
                "second_answers_accepted": worker.num_second_accepted,
            }
            for worker in hostile
        },
        "work_api": {
            "totals": work.totals.model_dump() if work else None,
            "per_worker": {
                names.get(wid, wid): counts.model_dump() for wid, counts in (work.workers.items() if work else [])
            },
            "unaccounted_per_worker": {
                names.get(wid, wid): c.num_unaccounted for wid, c in (work.workers.items() if work else [])
            },
            "flagged": {names.get(wid, wid): why for wid, why in (work.flagged.items() if work else [])},
        },
        "learner": learner_outcome(cluster),
        "learner_without_hostile_workers": baseline,
        "run_accounting": accounting,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "run_accounting"}, indent=1))
    print({k: v for k, v in accounting.items() if not isinstance(v, (dict, list))})


if __name__ == "__main__":
    main()
