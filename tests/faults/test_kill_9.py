"""kill -9 of each service, and of Redis, mid-run, one per run: the supervisor starts it again, the run
completes, and every group is accounted for (produced = trained + dropped + dead-lettered + pending)."""

from __future__ import annotations

import pytest

from shared.api import WorkerState
from tests.faults.cluster_run import assert_nothing_lost, assert_restarted_once_after_kill_9, kill
from tests.faults.conftest import FaultRunner

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def test_kill_9_of_a_worker(fault_run: FaultRunner) -> None:
    """Its unacked tasks are claimed by the others; the restarted process registers again and takes tasks."""
    run = fault_run(inject=kill("worker-0"), at_version=10)

    assert_restarted_once_after_kill_9(run, "worker-0")
    assert_nothing_lost(run)
    killed, restarted = run.workers_named("worker-0")  # a new process, a new registration
    assert killed.state == WorkerState.DEAD and killed.num_groups_done > 0
    assert restarted.state == WorkerState.ACTIVE and restarted.num_groups_done > 0


def test_kill_9_of_the_reward_service(fault_run: FaultRunner) -> None:
    """Rollouts it had read but not scored stay pending in its group and are scored after the restart."""
    run = fault_run(inject=kill("reward"), at_version=30)

    assert_restarted_once_after_kill_9(run, "reward")
    assert_nothing_lost(run)


def test_kill_9_of_the_learner(fault_run: FaultRunner) -> None:
    """It resumes from its last checkpoint; groups admitted after it are re-read (acked only once durable)."""
    run = fault_run(inject=kill("learner"), at_version=45)

    assert_restarted_once_after_kill_9(run, "learner")
    assert_nothing_lost(run)
    assert "resum" in run.log("learner").lower()


def test_kill_9_of_the_coordinator(fault_run: FaultRunner) -> None:
    """Its state is in Redis: the restarted coordinator keeps every worker's record and lease."""
    run = fault_run(inject=kill("coordinator"), at_version=30)

    assert_restarted_once_after_kill_9(run, "coordinator")
    assert_nothing_lost(run)
    for name in ("worker-0", "worker-1", "worker-2"):
        assert len(run.workers_named(name)) == 1, run.final_status.workers


def test_kill_9_of_redis(fault_run: FaultRunner) -> None:
    """Started again on its port with its AOF and ACL file; every service rides the outage out."""
    run = fault_run(inject=kill("redis"), at_version=30)

    assert_restarted_once_after_kill_9(run, "redis")  # and no other service crashed
    assert_nothing_lost(run)
