"""The local cluster with its learner sharded over 2 processes (`--learner-procs 2`: torchrun, FSDP2 on
gloo): a short run trains, rank 0 alone serves and announces the weights, and every process is gone after."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions
from tests.cluster_runs import run_to_completion

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def processes_of_run(run_dir: Path) -> list[int]:
    """PIDs of live processes whose environment names `run_dir` (the cluster's children and their ranks)."""
    marker = f"RL_RUN_DIR={run_dir}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def test_a_cluster_with_a_two_rank_learner_trains_and_leaves_no_process_behind(tmp_path: Path, repo_root: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(
        (repo_root / "tests" / "e2e" / "cluster_test.toml")
        .read_text()
        .replace("num_steps = 150", "num_steps = 30")
        .replace("checkpoint_every = 25", "checkpoint_every = 10")
        .replace("eval_every = 75", "eval_every = 15")
    )
    cluster, report = run_to_completion(
        ClusterOptions(config_path=config, num_workers=2, runs_dir=tmp_path, progress_interval_s=1.0, learner_procs=2)
    )

    assert report.num_steps == 30
    assert report.max_trained_staleness is not None
    assert report.max_trained_staleness <= cluster.run.schedule.staleness_bound
    assert report.num_dead_letters == 0
    assert all(w.policy_version > 0 and w.num_groups_done > 0 for w in report.workers), report.workers
    log = (cluster.run_dir / "logs" / "learner.log").read_text()
    assert "rank 1 of 2" in log and "policy sharded over 2 ranks" in log
    assert log.count("chunk server on") == 1  # rank 0's only
    assert processes_of_run(cluster.run_dir) == []
