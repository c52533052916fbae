"""The whole cluster as real processes (Redis, coordinator, reward, learner, 3 workers) for a short run, the
learner on one core and the workers on another where the machine has two (cluster/placement.py)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest

from cluster.local import ClusterOptions, LocalCluster
from cluster.placement import Placement
from tests.cluster_runs import run_to_completion
from tests.polling import wait_for

pytestmark = pytest.mark.e2e


def test_a_short_run_learns_within_the_staleness_bound_and_stops_every_process(tmp_path: Path, repo_root: Path) -> None:
    usable = sorted(os.sched_getaffinity(0))
    placement = Placement.parse(f"learner={usable[0]} workers={usable[-1]}", num_workers=3) if len(usable) > 1 else None
    pinned: dict[str, set[int]] = {}

    def read_affinities(cluster: LocalCluster) -> None:
        """Once each process is past `taskset` (it sets the cores, then execs Python under the same PID)."""
        if placement is None:
            return
        for name, process in cluster.services.items():
            want = set(placement.cores_of(name)) or set(usable)
            wait_for(partial(has_cores, process.pid, want), f"{name} on cores {want}", timeout_s=30)
            pinned[name] = os.sched_getaffinity(process.pid)

    cluster, report = run_to_completion(
        ClusterOptions(
            config_path=repo_root / "tests" / "e2e" / "cluster_test.toml",
            num_workers=3,
            runs_dir=tmp_path,
            progress_interval_s=1.0,
            placement=placement,
        ),
        read_affinities,
    )  # also checks that every child is gone (reaped), none left behind

    if placement is not None:  # each process on its role's cores; the services float
        assert pinned["learner"] == set(placement.learner), pinned
        assert all(pinned[f"worker-{i}"] == set(placement.workers) for i in range(3)), pinned
        assert pinned["coordinator"] == set(usable), pinned

    assert report.num_steps == cluster.run.schedule.num_steps
    assert report.max_trained_staleness is not None
    assert report.max_trained_staleness <= cluster.run.schedule.staleness_bound
    assert report.reward_mean_first10 is not None and report.reward_mean_last10 is not None
    assert report.reward_mean_last10 > report.reward_mean_first10 + 0.1, report
    assert report.num_dead_letters == 0
    workers = report.workers
    assert len(workers) == 3
    assert all(w.policy_version > 0 and w.num_groups_done > 0 for w in workers), workers
    for plot in ("reward_vs_step.png", "learning_curves.png", "staleness_histogram.png", "learner_busy_idle.png"):
        assert (cluster.run_dir / plot).stat().st_size > 1000
    # where the time went, and the verdict, from the coordinator's last status; what the evaluation learned
    assert report.time_use is not None and report.time_use.verdict != "too early", report.time_use
    assert report.time_use.verdict_line.startswith(report.time_use.verdict)
    assert report.time_use.workers_generating_s > 0 and report.time_use.learner_train_s > 0
    assert report.evals and all(e.format_rate is not None and e.chance_accuracy is not None for e in report.evals)


def has_cores(pid: int, cores: set[int]) -> bool:
    return os.sched_getaffinity(pid) == cores
