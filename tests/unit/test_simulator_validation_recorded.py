"""The simulator against recorded real runs (the fast variant of `make simulator-validation`): the measured
inputs of every run in benchmarks/results/simulator_validation.json go through the simulator again and
must still predict the measured learner utilization within 10%. (tests/e2e/
test_simulator_validation.py, marked slow, does the same on a fresh real run.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.config import load_run_config
from simulator.validation import MeasuredRun, predict


def recorded_runs(repo_root: Path) -> list[dict]:
    path = repo_root / "benchmarks" / "results" / "simulator_validation.json"
    if not path.exists():
        pytest.skip(f"{path} not recorded yet: python -m benchmarks.simulator_validation")
    return json.loads(path.read_text())["runs"]


def test_the_simulator_reproduces_every_recorded_real_run_within_ten_percent(repo_root: Path) -> None:
    runs = recorded_runs(repo_root)
    assert len(runs) >= 5
    for row in runs:
        run = load_run_config(repo_root / row["config"])
        measured = MeasuredRun(**row["measured"])
        run = run.model_copy(
            update={"schedule": run.schedule.model_copy(update={"staleness_bound": measured.staleness_bound})}
        )
        prediction = predict(
            run,
            measured,
            reward_poll_s=row["assumed"]["reward_poll_s"],
            max_groups_per_batch=row["assumed"]["max_groups_per_batch"],
        )
        assert prediction["simulated_utilization"] == pytest.approx(row["simulated_utilization"], abs=0.02), row["name"]
        assert abs(prediction["simulator_relative_error"]) <= 0.10, (row["name"], prediction)
