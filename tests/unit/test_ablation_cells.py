"""The staleness ablation's cells (benchmarks/ablation/cells.py): every cell is a valid run file with the
knobs it claims, and the measures it reports."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from benchmarks.ablation.cells import Cell, steps_to_reach
from shared.config import load_run_config
from shared.run_file import dump_run_file


@pytest.mark.parametrize("bound", [0, 1, 2, 4, 6, 11])
@pytest.mark.parametrize("correction", ["truncated_is", "none"])
def test_every_grid_cell_is_a_valid_run_file_with_its_knobs(tmp_path: Path, bound: int, correction: str) -> None:
    cell = Cell(bound, correction, seed=2)
    path = tmp_path / "cell.toml"
    path.write_text(dump_run_file(cell.run_file()))
    run = load_run_config(path)
    assert run.schedule.staleness_bound == bound and run.grpo.off_policy_correction == correction
    assert run.model.seed == run.task.seed == 2
    assert run.rollout.hold_versions_max == max(bound - 1, 0)
    assert run.max_groups_in_flight == run.grpo.groups_per_step  # one step of queue: lags come from the hold
    assert run.schedule.num_steps == 400 and not run.trust.enabled


def test_the_pull_baseline_holds_nothing_and_the_queue_cells_keep_the_default_bound(tmp_path: Path) -> None:
    pull = load_run_config(_write(tmp_path / "pull.toml", Cell(0, "truncated_is", 0, mode="pull")))
    assert pull.schedule.mode == "pull" and pull.rollout.hold_versions_max == 0
    queue = load_run_config(
        _write(tmp_path / "queue.toml", Cell(4, "truncated_is", 0, hold_versions_max=0, max_groups_in_flight=0))
    )
    assert queue.max_groups_in_flight == 3 * queue.grpo.groups_per_step and queue.rollout.hold_versions_max == 0


def test_toml_round_trips() -> None:
    raw = {"run_id": "x", "a": {"b": 1, "c": 0.5, "d": "e", "f": True, "g": [1, 2]}}
    assert tomllib.loads(dump_run_file(raw)) == raw


def test_steps_to_reach_is_the_first_step_whose_trailing_mean_reaches_the_target() -> None:
    rewards = [0.0] * 5 + [1.0] * 10
    assert steps_to_reach(rewards, 0.8, window=5) == 9  # steps 5-9 (1-based): 4 of 5 at 1.0
    assert steps_to_reach([0.5] * 20, 0.8, window=5) is None


def _write(path: Path, cell: Cell) -> Path:
    path.write_text(dump_run_file(cell.run_file()))
    return path
