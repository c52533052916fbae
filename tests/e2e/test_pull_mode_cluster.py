"""A whole local cluster in pull mode (`[schedule] mode = "pull"`): every trained group is on-policy and
nothing is generated to be dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions
from shared.run_file import dump_run_file, read_run_file
from tests.cluster_runs import run_to_completion

pytestmark = pytest.mark.e2e


def test_a_pull_mode_cluster_trains_only_on_policy_groups_and_drops_nothing(tmp_path: Path, repo_root: Path) -> None:
    raw = read_run_file(repo_root / "tests" / "e2e" / "cluster_test.toml")
    raw["schedule"] |= {"mode": "pull", "staleness_bound": 2, "num_steps": 12, "eval_every": 12}
    config = tmp_path / "pull.toml"
    config.write_text(dump_run_file(raw))
    cluster, report = run_to_completion(ClusterOptions(config_path=config, num_workers=2, runs_dir=tmp_path))
    assert report.num_steps == 12
    # S = 2 would admit lag 1 and 2: every group trained at lag 0 is the pull, not the bound
    assert report.staleness_histogram == {"0": 12 * 64}, report.staleness_histogram
    assert report.num_dropped_stale == 0
