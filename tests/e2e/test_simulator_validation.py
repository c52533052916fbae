"""The simulator against a fresh real run (a short `make simulator-validation`; slow): a real local cluster
(Redis, coordinator, reward, learner, 2 workers as processes) trains 40 steps; its measured inputs go
into the simulator, whose learner utilization must match the measured one.

The 10% target is the benchmark's (`make simulator-validation`, longer runs, results committed): targets
live in benchmarks, not in timed tests. A 30-step window on two shared cores puts the simulator's
relative error anywhere in 5-13% from run to run (2026-11-24: 9.7% and 9.9% at 29dec92, 5.7% and 13.2%
after issue 9, same machine), so this test bounds it at 25%: wide enough for that noise, tight enough to
catch a simulator that models the pipeline wrongly (a missing stage or a doubled one moves it by far more)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.measured_cluster import run_cluster
from simulator.validation import measure_run, predict

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # a real cluster run: ~40-60 s

TOLERANCE = 0.25  # a wrong model, not a noisy run (the benchmark holds the 10% target)


def test_the_simulator_predicts_a_real_runs_learner_utilization_within_ten_percent(
    repo_root: Path, tmp_path: Path
) -> None:
    config = repo_root / "benchmarks" / "simulator_validation.toml"
    steps, polls, pipeline, run = run_cluster("fast", config, 2, {"num_steps": 40}, tmp_path)
    measured = measure_run(run, steps, polls, warmup_steps=10, pipeline=pipeline)
    assert measured.num_workers == 2 and measured.num_steps == 30
    row = predict(run, measured, reward_poll_s=0.05, max_groups_per_batch=16)
    assert abs(row["simulator_relative_error"]) <= TOLERANCE, row
    assert row["simulated_max_staleness"] <= run.schedule.staleness_bound
