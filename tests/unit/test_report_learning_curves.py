"""The run report's learning curves: train reward and held-out accuracy against learner step, samples trained
(cumulative) and wall time; an evaluation of version t sits where step t ended, version 0 at the origin."""

from __future__ import annotations

from pathlib import Path

from cluster.report import learning_curve_axes, plot_learning_curves
from shared.messages import FlatGroups
from shared.run_records import EvalRecord
from tests.unit.test_report_zero_variance import step_record


def eval_record(version: int, accuracy: float, finished_s: float) -> EvalRecord:
    return EvalRecord(
        eval_step=version,
        eval_accuracy=accuracy,
        eval_reward_mean=accuracy,
        num_eval_prompts=10,
        eval_s=1.0,
        wall_s=finished_s,
    )


def test_evaluations_sit_at_the_samples_and_time_of_the_version_they_measured(tmp_path: Path) -> None:
    flat = FlatGroups(num_groups=2, num_flat_at_zero=0, num_flat_at_max=0, num_skipped=0, num_samples=8)
    steps = [step_record(step, flat) for step in (1, 2, 3)]  # 4 * 2 samples per step, wall_s = step
    evals = [eval_record(0, 0.1, 0.5), eval_record(2, 0.3, 9.0), eval_record(7, 0.9, 9.5)]  # 7: not in the log

    curves = learning_curve_axes(steps, evals)

    assert curves["reward"]["samples"] == [8.0, 16.0, 24.0]
    assert curves["reward"]["wall_s"] == [1.0, 2.0, 3.0]
    assert curves["eval_accuracy"] == {
        "step": [0.0, 2.0],
        "samples": [0.0, 16.0],
        "wall_s": [0.0, 2.0],  # where version 2 was made, not when its evaluation finished (9.0)
        "value": [0.1, 0.3],
    }
    assert plot_learning_curves(steps, evals, tmp_path / "curves.png").stat().st_size > 0
