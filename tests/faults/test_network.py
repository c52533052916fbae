"""Network faults across the emulated WAN (cluster/wan/testbed.py, docs/wan.md): the whole cluster with every
worker in a namespace of its own behind the `broadband` profile (20 Mbit/s up, 100 down, 30 ms, 0.1% loss),
the coordinator on https, one fault each. `make test-faults-wan`; needs root, `ip`, `tc` and `nft`.

Each run lasts a fixed time (the learner stops at max_wall_s) and must show: the learner went on training
through the fault and after it; every task and group is accounted for, in total and per worker (0 lost);
no worker was quarantined or flagged, and the cut-off worker was not billed for the time it was away; a
partitioned worker is back at the learner's newest version soon after the link heals.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from cluster.local import LocalCluster
from cluster.wan.profiles import load_fleet
from cluster.wan.testbed import CORE, Testbed, worker_node
from shared.api import BroadcastTimesResponse, CostResponse, RelayPlanResponse, StatusResponse, WorkerState
from shared.run_records import read_metrics
from shared.work_api import ACCOUNTING_PATH, WorkAccounting
from tests.faults.cluster_run import FAULTS_TOML, FaultRun, Injection
from tests.faults.conftest import FaultRunner
from tests.wan_capture import LinkCapture


def wan_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the WAN testbed needs root (network namespaces, tc, nftables)"
    missing = [tool for tool in ("ip", "tc", "nft") if shutil.which(tool) is None]
    return f"the WAN testbed needs {', '.join(missing)} (apt-get install iproute2 nftables)" if missing else None


pytestmark = [
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.wan,
    pytest.mark.skipif(wan_unavailable() is not None, reason=str(wan_unavailable())),
]

FLEET = "broadband"
VICTIM = "worker-1"
PRICE_PER_HOUR = 3.6  # $0.001 a second: what a worker bills shows how long it was counted active
WARM_UP_VERSION = 5  # the fault comes once the learner is here and every worker has delivered groups
AFTER_FAULT_S = 45.0  # the run goes on this long after the fault ends
# A healed worker first has to notice: its next heartbeat or lease call (backoff capped at this) reaches the
# coordinator, it registers again and fetches the newest version. The resync bound is 2 x T_bcast plus this.
RECONNECT_ALLOWANCE_S = 5.0


@dataclass
class Timeline:
    """What the runner saw after the injection: each status's time, the learner's published version and the
    victim's version and state; and when each scripted step ran."""

    marks: dict[str, float] = field(default_factory=dict)
    samples: list[tuple[float, int, int, str]] = field(default_factory=list)  # (time, published, victim's, state)

    def observe(self, cluster: LocalCluster, status: StatusResponse) -> None:
        if status.learner is None:
            return
        victims = [w for w in status.workers if w.name == VICTIM and w.state != WorkerState.DEAD]
        version = max((w.policy_version for w in victims), default=-1)
        state = victims[0].state.value if victims else "dead"
        self.samples.append((time.monotonic(), status.learner.published_version, version, state))

    def resync_s(self, after: str) -> float | None:
        """Seconds from mark `after` to the first status where the victim held the version published at that
        mark or a newer one (None: never)."""
        healed_s = self.marks[after]
        published_then = next((p for t, p, _, _ in self.samples if t >= healed_s), None)
        if published_then is None:
            return None
        back = [t for t, _, version, _ in self.samples if t >= healed_s and version >= published_then]
        return back[0] - healed_s if back else None

    def learner_versions_between(self, start: str, end: str) -> tuple[int, int]:
        inside = [p for t, p, _, _ in self.samples if self.marks[start] <= t <= self.marks[end]]
        return (inside[0], inside[-1]) if inside else (-1, -1)


Step = tuple[float, str, Callable[[Testbed, LocalCluster], None]]  # (seconds after the injection, mark, action)


def scripted(steps: list[Step], timeline: Timeline) -> Injection:
    """An injection that plays `steps` in a thread of its own (the runner keeps polling), marking each."""

    def play(cluster: LocalCluster) -> None:
        assert cluster.testbed is not None
        started_s = time.monotonic()
        for offset_s, mark, action in steps:
            time.sleep(max(0.0, started_s + offset_s - time.monotonic()))
            action(cluster.testbed, cluster)
            timeline.marks[mark] = time.monotonic()

    def inject(cluster: LocalCluster, status: StatusResponse) -> None:
        threading.Thread(target=play, args=(cluster,), daemon=True, name="network-fault").start()

    return inject


def timed_config(tmp_path: Path, max_wall_s: float) -> Path:
    """faults.toml, ended by time: the learner trains until max_wall_s (its steps are then what it reached)."""
    text = FAULTS_TOML.read_text().replace("num_steps = 100\n", "num_steps = 100000\n", 1)
    text = text.replace("max_wall_s = 300\n", f"max_wall_s = {max_wall_s}\n", 1)
    path = tmp_path / "faults_timed.toml"
    path.write_text(text)
    return path


@dataclass
class Inspection:
    accounting: WorkAccounting | None = None
    cost: CostResponse | None = None

    def __call__(self, cluster: LocalCluster, status: StatusResponse) -> None:
        headers = {"Authorization": f"Bearer {cluster.admin_token}"}
        with httpx.Client(base_url=cluster.coordinator_url, verify=cluster.coordinator_verify(), timeout=10) as client:
            self.accounting = WorkAccounting.model_validate_json(client.get(ACCOUNTING_PATH, headers=headers).content)
            self.cost = CostResponse.model_validate_json(client.get("/v1/cost").content)


def run_network_fault(
    fault_run: FaultRunner, tmp_path: Path, steps: list[Step], fault_s: float
) -> tuple[FaultRun, Timeline, Inspection]:
    timeline, inspection = Timeline(), Inspection()
    price = {"RL_WORKER_PRICE_PER_HOUR": str(PRICE_PER_HOUR)}
    run = fault_run(
        inject=scripted(steps, timeline),
        at_version=WARM_UP_VERSION,
        wan=load_fleet(FLEET),
        tls=True,
        config_path=timed_config(tmp_path, max_wall_s=30.0 + fault_s + AFTER_FAULT_S),
        observe=timeline.observe,
        inspect=inspection,
        worker_env={f"worker-{i}": price for i in range(3)},
    )
    run.row["fleet"] = FLEET
    return run, timeline, inspection


def assert_nothing_lost_in_time(run: FaultRun, inspection: Inspection) -> None:
    """Every group produced is trained, dropped with a reason or pending; none dead-lettered; every lease of every
    worker accounted for (accepted, failed, expired or held); every trained token within the staleness bound."""
    accounting = run.accounting
    assert accounting.num_unaccounted == 0, accounting.summary()
    assert accounting.num_trained == run.report.num_steps * run.cluster.run.grpo.groups_per_step, accounting.summary()
    assert accounting.num_dead_lettered_reward + accounting.num_dead_lettered_learner == 0, accounting.summary()
    steps, _ = read_metrics(run.run_dir / "metrics.jsonl")
    bound = run.cluster.run.schedule.staleness_bound
    assert max(int(lag) for step in steps for lag in step.token_staleness_histogram) <= bound
    assert inspection.accounting is not None
    lost = {worker: counts.num_unaccounted for worker, counts in inspection.accounting.workers.items()}
    assert not any(lost.values()), lost
    run.row["tasks_lost_per_worker"] = lost


def assert_nobody_punished(run: FaultRun, inspection: Inspection, away_s: float = 0.0) -> None:
    """No registration quarantined, no worker flagged; the victim billed for at most the time it was reachable
    (its run time less `away_s`, plus one billing gap of slack)."""
    assert not [w.name for w in run.final_status.workers if w.state == WorkerState.QUARANTINED]
    assert inspection.accounting is not None and inspection.cost is not None
    assert inspection.accounting.flagged == {}, inspection.accounting.flagged
    victim_ids = {w.worker_id for w in run.final_status.workers if w.name == VICTIM}
    billed_s = (
        sum(inspection.cost.usd_by_worker.get(worker_id, 0.0) for worker_id in victim_ids) * 3600 / PRICE_PER_HOUR
    )
    slack_s = run.cluster.run.activation.max_billing_gap_s
    assert billed_s <= run.wall_s - away_s + slack_s, (billed_s, run.wall_s, away_s)
    run.row["victim_billed_s"] = round(billed_s, 1)


def assert_recovered(run: FaultRun, timeline: Timeline, inspection: Inspection, after: str) -> None:
    """Nothing lost, nobody punished, and the victim back at the newest version after mark `after`."""
    assert_nothing_lost_in_time(run, inspection)
    assert_nobody_punished(run, inspection)
    resync_s = timeline.resync_s(after)
    assert resync_s is not None, f"{VICTIM} never came back to the newest version after {after}"
    run.row["resync_s"] = round(resync_s, 2)


def healthy_broadcast_p95_s(run: FaultRun, timeline: Timeline, fault_start: str, fault_end: str) -> float:
    """T_bcast p95 of this run's link when healthy (learner publish -> weights in every engine, the coordinator's
    record), over the versions published outside the fault and the 30 s after it."""
    times = BroadcastTimesResponse.model_validate_json((run.run_dir / "broadcast_times.json").read_text())
    start_s, end_s = timeline.marks[fault_start], timeline.marks[fault_end] + 30.0
    during = {published for t, published, _, _ in timeline.samples if start_s <= t <= end_s}
    first, last = (min(during), max(during)) if during else (0, -1)
    seconds = sorted(s for version, s in times.seconds_by_version.items() if not first <= version <= last)
    return statistics.quantiles(seconds, n=20)[-1] if len(seconds) >= 2 else max(seconds, default=0.0)


@pytest.mark.parametrize("partition_s", [30.0, 150.0])
def test_partitioned_worker_comes_back(fault_run: FaultRunner, tmp_path: Path, partition_s: float) -> None:
    """A worker cut off for 30 s (longer than its lease and heartbeat deadline) and for 150 s (longer than every
    deadline, its version evicted from the learner): its tasks go to the others, nothing is lost, it is not
    punished, and it is back at the newest version within 2 x T_bcast of healing (+ one heartbeat backoff)."""
    node = worker_node(int(VICTIM.removeprefix("worker-")))
    steps: list[Step] = [
        (0.0, "cut", lambda testbed, _: testbed.partition(node)),
        (partition_s, "healed", lambda testbed, _: testbed.heal(node)),
    ]
    run, timeline, inspection = run_network_fault(fault_run, tmp_path, steps, partition_s)
    assert_nothing_lost_in_time(run, inspection)
    assert_nobody_punished(run, inspection, away_s=partition_s)
    first, last = timeline.learner_versions_between("cut", "healed")
    assert last > first, "the learner stopped while one worker was cut off"
    resync_s = timeline.resync_s("healed")
    assert resync_s is not None, f"{VICTIM} never came back to the newest version"
    t_bcast_p95_s = healthy_broadcast_p95_s(run, timeline, "cut", "healed")
    run.row.update(
        partition_s=partition_s,
        resync_s=round(resync_s, 2),
        t_bcast_p95_s=round(t_bcast_p95_s, 2),
        learner_versions_during=[first, last],
    )
    assert resync_s <= 2 * t_bcast_p95_s + RECONNECT_ALLOWANCE_S, run.row


def test_flapping_link(fault_run: FaultRunner, tmp_path: Path) -> None:
    """A link that goes down for 3 s and up for 3 s, eight times: the worker keeps working between the drops."""
    node = worker_node(int(VICTIM.removeprefix("worker-")))
    steps: list[Step] = []
    for cycle in range(8):
        steps.append((6.0 * cycle, f"down{cycle}", lambda testbed, _: testbed.partition(node)))
        steps.append((6.0 * cycle + 3.0, f"up{cycle}", lambda testbed, _: testbed.heal(node)))
    run, timeline, inspection = run_network_fault(fault_run, tmp_path, steps, fault_s=48.0)
    assert_recovered(run, timeline, inspection, after="up7")


def test_loss_burst(fault_run: FaultRunner, tmp_path: Path) -> None:
    """20% of the victim's packets lost both ways for 30 s: slower, never wrong."""
    node = worker_node(int(VICTIM.removeprefix("worker-")))
    steps: list[Step] = [
        (0.0, "loss", lambda testbed, _: testbed.set_loss(node, 20.0)),
        (30.0, "clear", lambda testbed, _: testbed.clear_loss(node)),
    ]
    run, timeline, inspection = run_network_fault(fault_run, tmp_path, steps, fault_s=30.0)
    assert_recovered(run, timeline, inspection, after="clear")


def test_learner_uplink_cut(fault_run: FaultRunner, tmp_path: Path) -> None:
    """The learner's chunk server unreachable for 20 s: no worker gets a new version, so every group waits at
    the staleness gate; the learner trains what it has, then everything catches up."""
    steps: list[Step] = [
        (0.0, "cut", lambda testbed, cluster: testbed.block_port(CORE, cluster.learner_port, "learner")),
        (20.0, "restored", lambda testbed, _: testbed.unblock_port(CORE, "learner")),
    ]
    run, timeline, inspection = run_network_fault(fault_run, tmp_path, steps, fault_s=20.0)
    assert_recovered(run, timeline, inspection, after="restored")
    first, last = timeline.learner_versions_between("cut", "restored")
    assert run.report.num_steps > last, "the learner did not go on after the learner's link came back"


def test_coordinator_unreachable(fault_run: FaultRunner, tmp_path: Path) -> None:
    """The coordinator unreachable from every worker for 15 s (the runner still reaches it): leases and
    heartbeats lapse everywhere at once; every worker comes back and nothing is lost."""

    def cut(testbed: Testbed, cluster: LocalCluster) -> None:
        testbed.block_port(CORE, int(cluster.coordinator_url.rsplit(":", 1)[1]), "coordinator")

    steps: list[Step] = [
        (0.0, "cut", cut),
        (15.0, "restored", lambda testbed, _: testbed.unblock_port(CORE, "coordinator")),
    ]
    run, timeline, inspection = run_network_fault(fault_run, tmp_path, steps, fault_s=15.0)
    assert_recovered(run, timeline, inspection, after="restored")


def test_short_wan_run_with_a_partition_a_natted_worker_and_tls(fault_run: FaultRunner, tmp_path: Path) -> None:
    """CI's run on the testbed (`make test-faults-wan-short`, ~2 min): three broadband workers, worker-2 behind
    NAT, the coordinator on https, worker-1 partitioned for 20 s, every frame on every link captured. The NAT'd
    worker is found unreachable and planned as a leaf that still fetches every version; the partitioned worker
    comes back; nothing is lost; and no credential crosses a link in clear text: neither the join token nor any
    Authorization header is in a captured frame, while TLS records are (and a control request sent in clear
    text from a worker's namespace is seen, so the capture does see what crosses)."""
    nat_index = 2
    node = worker_node(int(VICTIM.removeprefix("worker-")))
    control = b"Authorization: Bearer control-" + os.urandom(8).hex().encode()
    capture = LinkCapture("rlw", needles={"authorization": b"Authorization", "control": control})
    plans: list[RelayPlanResponse] = []

    def start_capture_and_partition(testbed: Testbed, cluster: LocalCluster) -> None:
        capture.needles["join token"] = cluster.join_token.encode()
        capture.needles["admin token"] = cluster.admin_token.encode()
        capture.start()
        testbed.partition(node)

    def send_control(testbed: Testbed, cluster: LocalCluster) -> None:
        # the control: a request with a (fake) credential, in clear text, from worker-0's namespace
        host, port = cluster.services_host, int(cluster.coordinator_url.rsplit(":", 1)[1])
        program = (
            "import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5);"
            f" s.sendall(b'GET / HTTP/1.1\\r\\n' + {control!r} + b'\\r\\n\\r\\n'); s.close()"
        )
        subprocess.run(testbed.command(worker_node(0), [sys.executable, "-c", program, host, str(port)]), check=True)

    def read_plan(testbed: Testbed, cluster: LocalCluster) -> None:
        with httpx.Client(base_url=cluster.coordinator_url, verify=cluster.coordinator_verify(), timeout=10) as client:
            plans.append(RelayPlanResponse.model_validate_json(client.get("/v1/broadcast/plan").content))

    timeline, inspection = Timeline(), Inspection()
    steps: list[Step] = [
        (0.0, "cut", start_capture_and_partition),
        (1.0, "control", send_control),
        (20.0, "healed", lambda testbed, _: testbed.heal(node)),
        (35.0, "plan", read_plan),
    ]
    try:
        run = fault_run(
            inject=scripted(steps, timeline),
            at_version=WARM_UP_VERSION,
            wan=load_fleet(FLEET, nat=frozenset({nat_index})),
            tls=True,
            config_path=timed_config(tmp_path, max_wall_s=75.0),
            observe=timeline.observe,
            inspect=inspection,
        )
    finally:
        capture.stop()
    assert_nothing_lost_in_time(run, inspection)
    assert_nobody_punished(run, inspection)
    assert timeline.resync_s("healed") is not None
    natted = [w for w in run.final_status.workers if w.name == f"worker-{nat_index}" and w.state != WorkerState.DEAD]
    assert natted and all(w.inbound_reachable is False for w in natted), natted
    assert natted[0].num_groups_done > 0 and natted[0].policy_version >= run.report.num_steps - 5
    assert plans, "the relay plan was not read"
    natted_ids = {w.worker_id for w in natted}
    assert not [a for a in plans[0].assignments if a.parent_id in natted_ids], plans[0]
    assert capture.hits.get("control", 0) >= 1, "the capture did not see the clear-text control request"
    # the control request is the only frame that may carry an Authorization header; no token crosses at all
    assert capture.hits.get("authorization", 0) == capture.hits["control"], capture.hits
    leaked = {name: count for name, count in capture.hits.items() if name not in ("control", "authorization")}
    assert leaked == {}, capture.hits
    assert capture.num_tls_records > 100, capture.num_tls_records
    run.row.update(
        captured_frames=capture.num_frames,
        captured_bytes=capture.num_bytes,
        tls_records=capture.num_tls_records,
        credential_hits=leaked,
        nat_worker_reachable=False,
    )
