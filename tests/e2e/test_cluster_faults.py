"""Four faults in one run of the whole supervised cluster: kill -9 a rollout worker, the learner, the reward
service and the coordinator mid-run, one after the other, and let the runner's supervisor restart each one.
(One fault per run, Redis included, is the fault suite: tests/faults/, `make test-faults`.)

Nothing is lost: the run still reaches its step count (the restarted learner resumes from its
checkpoint, a dead worker's unfinished tasks are claimed by the others), nothing beyond S is trained
on, the dead-letter stream stays empty, every restart is counted with its exit code, and every group
produced is trained, dropped with a reason, dead-lettered or still pending.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cluster.local import ClusterOptions, LocalCluster
from cluster.report import write_report
from cluster.supervisor import ServiceRestarts
from shared.api import StatusResponse

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# learner version at which each service is killed -9 (in this order)
KILLS = {"worker-0": 30, "learner": 60, "reward": 85, "coordinator": 105}


def test_the_supervised_run_survives_kill_9_of_a_worker_the_learner_the_reward_service_and_the_coordinator(
    tmp_path: Path, repo_root: Path
) -> None:
    run_file = tmp_path / "run.toml"  # the e2e run with time for four restarts
    run_file.write_text(
        (repo_root / "tests" / "e2e" / "cluster_test.toml").read_text().replace("max_wall_s = 150", "max_wall_s = 600")
    )
    cluster = LocalCluster(
        ClusterOptions(
            config_path=run_file,
            num_workers=3,
            runs_dir=tmp_path / "runs",
            progress_interval_s=0.5,
            restart_base_delay_s=0.5,
        )
    )
    killed: dict[str, int] = {}  # service -> pid killed

    def inject_faults(status: StatusResponse) -> None:
        version = status.learner.learner_version if status.learner is not None else 0
        for name, at_version in KILLS.items():
            if version >= at_version and name not in killed:
                process = cluster.services[name]
                killed[name] = process.pid
                process.kill()  # the supervisor notices at its next poll and restarts it

    try:
        cluster.start()
        status = cluster.wait_until_done(inject_faults)
    finally:
        cluster.stop()
    report = write_report(cluster.run_dir, cluster.run, status, wall_s=0.0)

    assert list(killed) == list(KILLS)
    assert report.num_steps == cluster.run.schedule.num_steps
    assert report.max_trained_staleness is not None
    assert report.max_trained_staleness <= cluster.run.schedule.staleness_bound
    assert report.num_dead_letters == 0
    assert report.reward_mean_first10 is not None and report.reward_mean_last10 is not None
    assert report.reward_mean_last10 > report.reward_mean_first10 + 0.1
    restarted_once = ServiceRestarts(num_restarts=1, crash_exit_codes=[-signal.SIGKILL], gave_up=False)
    for name in KILLS:  # restarted once each, after its kill -9; nothing else crashed
        assert report.restarts[name] == restarted_once
        assert cluster.services[name].pid != killed[name]
    assert report.num_restarts == len(KILLS) and report.gave_up_on == []
    accounting = report.accounting
    assert accounting is not None
    assert accounting.num_unaccounted == 0, accounting.summary()
    assert accounting.num_trained == cluster.run.schedule.num_steps * cluster.run.grpo.groups_per_step
    assert accounting.num_produced > accounting.num_trained
    assert accounting.num_dead_lettered_reward == accounting.num_dead_lettered_learner == 0
    log = (cluster.run_dir / "logs" / "learner.log").read_text()
    assert "resum" in log.lower()
