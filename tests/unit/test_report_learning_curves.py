"""The run report's learning curves: train reward and held-out accuracy against learner step, samples trained
(cumulative) and wall time; an evaluation of version t sits where step t ended, version 0 at the origin."""

from __future__ import annotations

from pathlib import Path

from cluster.report import learning_curve_axes, plot_learning_curves
from tests.run_records import eval_record, step_record


def test_evaluations_sit_at_the_samples_and_time_of_the_version_they_measured(tmp_path: Path) -> None:
    steps = [step_record(step, num_samples=8) for step in (1, 2, 3)]  # wall_s = step
    evals = [eval_record(0, 0.1, wall_s=0.5), eval_record(2, 0.3, wall_s=9.0), eval_record(7, 0.9, wall_s=9.5)]

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
