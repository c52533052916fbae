"""Held-out evaluation in the whole cluster as real processes (Redis, coordinator, reward, learner, 2 workers; the
demo's task and model, a short run): with the default `[learner] eval_on = "workers"` the workers evaluate (the
final evaluation among them, so "after" is the final weights' as the workers measured it), and with
`eval_on = "learner"` the learner's own eval thread evaluates every point. Either way each eval point has one
record and the run's group accounting closes: eval tasks never count as work."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions
from shared.run_records import LearnerSummary, read_metrics
from tests.cluster_runs import run_to_completion

pytestmark = pytest.mark.e2e

NUM_STEPS, EVAL_EVERY = 12, 4

RUN_FILE = f"""
run_id = "evals"

[model]
init = "tiny-random"
max_position_embeddings = 32

[task]
name = "arithmetic_mod10"
num_eval_prompts = 20

[grpo]
group_size = 8
groups_per_step = 16
max_new_tokens = 2

[schedule]
staleness_bound = 2
num_steps = {NUM_STEPS}
checkpoint_every = 6
eval_every = {EVAL_EVERY}
max_wall_s = 150

[broadcast]
chunk_size_bytes = 65536
"""


# ~20 s each on 2 cores; the learner's own evaluation is also covered by the learner's integration tests
@pytest.mark.parametrize("eval_on", ["workers", pytest.param("learner", marks=pytest.mark.slow)])
def test_evaluation_runs_where_the_run_file_says_and_each_eval_point_has_one_record(
    eval_on: str, tmp_path: Path
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(RUN_FILE + f'\n[learner]\neval_on = "{eval_on}"\n')
    cluster, report = run_to_completion(
        ClusterOptions(config_path=config, num_workers=2, runs_dir=tmp_path, progress_interval_s=1.0)
    )

    assert report.num_steps == NUM_STEPS
    _, evals = read_metrics(cluster.run_dir / "metrics.jsonl")
    by_version = {record.eval_step: record for record in evals}
    assert sorted(by_version) == list(range(0, NUM_STEPS + 1, EVAL_EVERY)), evals  # one record per eval point
    assert len(evals) == len(by_version)
    final = by_version[NUM_STEPS]
    if eval_on == "learner":
        assert {record.evaluated_by for record in evals} == {"learner"}
    else:
        assert final.evaluated_by == "workers", evals
        assert all(r.eval_stall_s == 0.0 and r.num_eval_prompts == 20 for r in evals if r.evaluated_by == "workers")
    summary = LearnerSummary.model_validate_json((cluster.run_dir / "learner_summary.json").read_text())
    assert summary.eval_accuracy_after == final.eval_accuracy
    assert summary.eval_accuracy_before == by_version[0].eval_accuracy
    assert report.accounting is not None and report.accounting.num_unaccounted == 0, report.accounting
