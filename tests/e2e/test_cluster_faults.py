"""Fault injection on the whole cluster: kill -9 a rollout worker and the learner mid-run.

Nothing admitted is lost: the run still reaches its step count, the dead worker's unfinished tasks
are claimed by the others, the restarted learner resumes from its checkpoint, nothing beyond S is
trained on, and the dead-letter stream stays empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions, LocalCluster
from cluster.report import write_report
from shared.api import StatusResponse

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_run_survives_a_killed_worker_and_a_killed_learner(tmp_path: Path, repo_root: Path) -> None:
    cluster = LocalCluster(
        ClusterOptions(
            config_path=repo_root / "tests" / "e2e" / "cluster_test.toml",
            num_workers=3,
            runs_dir=tmp_path,
            progress_interval_s=0.5,
        )
    )
    injected: list[str] = []

    def inject_faults(status: StatusResponse) -> None:
        version = status.learner.learner_version if status.learner is not None else 0
        if version >= 30 and "worker" not in injected:
            cluster.services["worker-0"].kill()
            injected.append("worker")
        if version >= 60 and "learner" not in injected:
            cluster.services["learner"].kill()
            injected.append("learner")
            cluster.start_learner()  # same run dir: resumes from checkpoints/latest.pt

    try:
        cluster.start()
        status = cluster.wait_until_done(inject_faults, ignore_dead={"worker-0"})
    finally:
        cluster.stop()
    report = write_report(cluster.run_dir, cluster.run, status, wall_s=0.0)

    assert injected == ["worker", "learner"]
    assert report["num_steps"] == cluster.run.schedule.num_steps
    assert report["max_trained_staleness"] <= cluster.run.schedule.staleness_bound
    assert report["num_dead_letters"] == 0
    assert report["reward_mean_last10"] > report["reward_mean_first10"] + 0.1
    states = {w["name"]: w["state"] for w in report["workers"]}
    assert states["worker-0"] == "dead"
    assert sum(1 for name, state in states.items() if name != "worker-0" and state != "dead") == 2
    log = (cluster.run_dir / "logs" / "learner.log").read_text()
    assert "resum" in log.lower()
