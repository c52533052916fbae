"""One short supervised run of the whole local cluster with one injected fault, for the fault suite.

    run = run_with_fault(tmp_path, model_dir, inject=kill("reward"), at_version=30)

starts the cluster of cluster/local.py (Redis with ACLs, coordinator, reward, learner, N rollout workers,
every one supervised) on tests/faults/faults.toml, calls `inject(cluster, status)` once, at the first
status where the learner has reached `at_version` and every worker has delivered groups, waits for the
learner to finish, takes the final coordinator status, calls `inspect(cluster, final_status)` (Redis and
every service still up), stops everything by PID (the runner counts the groups before it stops Redis),
writes the run report and returns it with the group accounting (cluster/accounting.py). `FaultRun.row`
is the test's line in benchmarks/results/fault_suite.json (tests/faults/conftest.py writes it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.liar_worker import liar_entry_points
from cluster.accounting import GroupAccounting
from cluster.local import ClusterOptions, LocalCluster
from cluster.redis_acl import OPERATOR
from cluster.report import write_report
from cluster.run_report import RunReport
from cluster.supervisor import ServiceRestarts
from cluster.wan.profiles import Fleet
from shared.api import StatusResponse, WorkerInfo
from shared.bus import StreamBus, connect
from shared.keys import RunKeys
from shared.run_records import read_metrics

FAULTS_TOML = Path(__file__).with_name("faults.toml")

Injection = Callable[[LocalCluster, StatusResponse], None]
Inspection = Callable[[LocalCluster, StatusResponse], None]  # (the cluster, its final status)
Observation = Callable[[LocalCluster, StatusResponse], None]  # every status the runner sees, after injecting


@dataclass
class FaultRun:
    cluster: LocalCluster
    final_status: StatusResponse  # the coordinator's, once the learner had finished
    report: RunReport  # runs/<id>/report.json
    accounting: GroupAccounting
    injected_at_version: int | None  # the learner version seen when the fault was injected
    wall_s: float
    row: dict[str, Any] = field(default_factory=dict)  # this test's line of the suite's results table

    @property
    def run_dir(self) -> Path:
        return self.cluster.run_dir

    def workers_named(self, name: str) -> list[WorkerInfo]:
        """Every registration of the worker service `name` (a worker keeps its id when it re-registers), the oldest
        first (the status lists live workers before dead ones)."""
        named = [worker for worker in self.final_status.workers if worker.name == name]
        return sorted(named, key=lambda worker: worker.registered_at_s)

    def log(self, service: str) -> str:
        return (self.run_dir / "logs" / f"{service}.log").read_text()


def run_with_fault(
    tmp_path: Path,
    model_dir: Path,
    *,
    inject: Injection | None = None,
    at_version: int = 0,
    inspect: Inspection | None = None,
    num_workers: int = 3,
    liars: dict[str, str] | None = None,
    worker_env: dict[str, dict[str, str]] | None = None,
    wan: Fleet | None = None,
    tls: bool = False,
    config_path: Path | None = None,
    observe: Observation | None = None,
) -> FaultRun:
    """`wan`: run across the emulated WAN (tests/faults/test_network.py); `tls`: the coordinator on https;
    `config_path`: another run file than faults.toml; `observe`: called with every status after the injection."""
    cluster = LocalCluster(
        ClusterOptions(
            config_path=config_path or fault_suite_config(tmp_path),
            num_workers=num_workers,
            runs_dir=tmp_path / "runs",
            model_dir=model_dir,
            progress_interval_s=0.5,
            restart_base_delay_s=0.5,
            worker_entry_points=liar_entry_points(liars or {}),
            worker_env=worker_env or {},
            wan=wan,
            tls=tls,
        )
    )
    injected: list[int] = []

    def on_progress(status: StatusResponse) -> None:
        version = status.learner.learner_version if status.learner is not None else -1
        if inject is not None and not injected and version >= at_version and all_working(status, num_workers):
            injected.append(version)
            inject(cluster, status)
        if observe is not None and injected:
            observe(cluster, status)

    started_s = time.monotonic()
    try:
        cluster.start()
        cluster.wait_until_done(on_progress)
        assert inject is None or injected, f"the run ended before the fault could be injected (at step {at_version})"
        final_status = final_status_of(cluster)
        if inspect is not None:
            inspect(cluster, final_status)
    finally:
        cluster.stop()
    wall_s = time.monotonic() - started_s
    report = write_report(cluster.run_dir, cluster.run, final_status, wall_s=wall_s)
    accounting = GroupAccounting.model_validate_json((cluster.run_dir / "accounting.json").read_text())
    run = FaultRun(cluster, final_status, report, accounting, injected[0] if injected else None, wall_s)
    run.row = result_row(run)
    return run


def fault_suite_config(tmp_path: Path) -> Path:
    """faults.toml, or under RL_FAULT_SUITE_BATCHING=continuous (`make test-faults-continuous`) the same run
    with continuous batching and in-flight weight updates on the workers (docs/continuous_batching.md) and
    longer samples."""
    batching = os.environ.get("RL_FAULT_SUITE_BATCHING", "batch")
    if batching == "batch":
        return FAULTS_TOML
    if batching != "continuous":
        raise ValueError(f"RL_FAULT_SUITE_BATCHING={batching!r}: expected batch or continuous")
    text = FAULTS_TOML.read_text().replace("[rollout]\n", '[rollout]\nbatching = "continuous"\n', 1)
    # samples of up to 16 tokens (a random policy's lengths are geometric, mean ~10): a kill or a new
    # version lands while samples are mid-sequence, which the 2-token completions of faults.toml never see
    text = text.replace("max_new_tokens = 2\n", "max_new_tokens = 16\n", 1)
    path = tmp_path / "faults_continuous.toml"
    path.write_text(text)
    return path


def all_working(status: StatusResponse, num_workers: int) -> bool:
    """Every worker of the cluster has registered and delivered groups: the fault hits a working cluster."""
    working = {worker.name for worker in status.workers if worker.num_groups_done > 0}
    return all(f"worker-{index}" in working for index in range(num_workers))


def final_status_of(cluster: LocalCluster) -> StatusResponse:
    """The coordinator's status now (the supervisor restarts a killed coordinator: wait for it)."""
    deadline_s = time.monotonic() + 60.0
    with httpx.Client(base_url=cluster.coordinator_url, timeout=5.0, verify=cluster.coordinator_verify()) as client:
        while (status := cluster.fetch_status(client)) is None:
            if time.monotonic() > deadline_s:
                raise TimeoutError("no status from the coordinator after the run")
            cluster.supervisor.poll()
            time.sleep(0.2)
    return status


def result_row(run: FaultRun) -> dict[str, Any]:
    """The accounting and restarts of one fault run, as benchmarks/results/fault_suite.json shows them."""
    accounting = run.accounting
    return {
        "injected_at_version": run.injected_at_version,
        "num_steps": run.report.num_steps,
        "run_wall_s": round(run.wall_s, 1),
        "restarts": {name: r.crash_exit_codes for name, r in run.report.restarts.items() if r.num_restarts},
        "accounting": {
            "produced": accounting.num_produced,
            "trained": accounting.num_trained,
            "dropped": accounting.num_dropped,
            "dead_lettered": accounting.num_dead_lettered_reward + accounting.num_dead_lettered_learner,
            "pending": accounting.num_pending_reward + accounting.num_pending_learner,
            "unaccounted": accounting.num_unaccounted,
        },
    }


def assert_nothing_lost(run: FaultRun, *, num_dead_lettered: int = 0) -> None:
    """The run reached its step count within the staleness bound, and every group produced is trained,
    dropped with a reason, dead-lettered (exactly `num_dead_lettered`) or still pending."""
    schedule = run.cluster.run.schedule
    accounting = run.accounting
    assert run.report.num_steps == schedule.num_steps, run.report
    assert run.report.max_trained_staleness is not None
    if schedule.admission == "oldest_token":
        assert run.report.max_trained_staleness <= schedule.staleness_bound
    # every trained token within S (per_token admission masks a group's older tokens out of the loss)
    steps, _ = read_metrics(run.run_dir / "metrics.jsonl")
    assert max(int(lag) for step in steps for lag in step.token_staleness_histogram) <= schedule.staleness_bound
    assert accounting.num_unaccounted == 0, accounting.summary()
    assert accounting.num_trained == schedule.num_steps * run.cluster.run.grpo.groups_per_step, accounting.summary()
    assert accounting.num_produced >= accounting.num_trained
    dead_lettered = accounting.num_dead_lettered_reward + accounting.num_dead_lettered_learner
    assert dead_lettered == num_dead_lettered, accounting.summary()


def operator_bus(cluster: LocalCluster) -> StreamBus:
    """The run's streams as the operator sees them (every key, every command); close its client."""
    return StreamBus(connect(cluster.redis_url_for(OPERATOR)), RunKeys(cluster.run.run_id), service="fault-suite")


def kill(service: str) -> Injection:
    """kill -9 of one supervised service (or "redis"); the supervisor restarts it at its next poll."""

    def inject(cluster: LocalCluster, status: StatusResponse) -> None:
        if service == "redis":
            assert cluster.redis is not None
            cluster.redis.kill()
        else:
            cluster.services[service].kill()

    return inject


def assert_restarted_once_after_kill_9(run: FaultRun, service: str) -> None:
    """`service` crashed once (the kill -9) and was started again; nothing else crashed."""
    restarts = run.report.restarts
    assert restarts[service] == ServiceRestarts(num_restarts=1, crash_exit_codes=[-signal.SIGKILL], gave_up=False)
    crashed = {name: r.crash_exit_codes for name, r in restarts.items() if r.crash_exit_codes}
    assert crashed == {service: [-signal.SIGKILL]}
    assert run.report.gave_up_on == []
