"""The whole cluster as real processes (Redis, coordinator, reward, learner, 3 workers) for a short run."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions
from tests.cluster_runs import run_to_completion

pytestmark = pytest.mark.e2e


def test_a_short_run_learns_within_the_staleness_bound_and_stops_every_process(tmp_path: Path, repo_root: Path) -> None:
    cluster, report = run_to_completion(
        ClusterOptions(
            config_path=repo_root / "tests" / "e2e" / "cluster_test.toml",
            num_workers=3,
            runs_dir=tmp_path,
            progress_interval_s=1.0,
        )
    )  # also checks that every child is gone (reaped), none left behind

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
