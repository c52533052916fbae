"""make bench-vs-trl's bookkeeping (benchmarks/vs_trl.py, vs_trl_summary.py): accuracy interpolated at equal
samples and equal wall time, finished cells skipped, each cell's run file. No TRL needed."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from benchmarks.vs_trl import OUT_DIR, Options, cell_run_file, cells_to_run, eval_points, step_points
from benchmarks.vs_trl_records import CellRecord, EvalPoint, StepPoint, load_records, save_record
from benchmarks.vs_trl_summary import common_budget, interpolate, summarize, write_summary
from shared.config import RunConfig
from shared.run_file import dump_run_file
from shared.run_records import EvalRecord, StepRecord
from tests.run_records import eval_record, step_record


def record(cell: str, seed: int, evals: list[tuple[int, float, float]], samples_per_step: int = 10) -> CellRecord:
    """A cell record whose evals are (step, wall_s, accuracy); a step every eval step."""
    points = [EvalPoint(step=s, num_samples=s * samples_per_step, wall_s=w, accuracy=a) for s, w, a in evals]
    steps = [
        StepPoint(
            step=s,
            num_samples=s * samples_per_step,
            num_trained_samples=s * samples_per_step,
            wall_s=w,
            reward_mean=0.5,
        )
        for s, w, _ in evals
        if s
    ]
    return CellRecord(
        cell=cell,  # type: ignore[arg-type]
        seed=seed,
        system="trl" if cell == "trl" else "ours",
        run_file="x.toml",
        model_dir="m",
        samples_per_step=samples_per_step,
        num_eval_prompts=4,
        clock="test",
        evals=points,
        steps=steps,
        total_s=1.0,
    )


def test_interpolate_is_linear_between_points_and_none_outside() -> None:
    points = [(10.0, 0.5), (0.0, 0.1), (20.0, 0.5)]  # unsorted on purpose
    assert interpolate(points, 5.0) == pytest.approx(0.3)
    assert interpolate(points, 0.0) == pytest.approx(0.1)
    assert interpolate(points, 15.0) == pytest.approx(0.5)
    assert interpolate(points, 20.0) == pytest.approx(0.5)
    assert interpolate(points, 20.5) is None and interpolate(points, -1.0) is None
    assert interpolate([(3.0, 0.7)], 3.0) == 0.7 and interpolate([], 0.0) is None


def test_equal_samples_and_equal_wall_time_are_read_at_the_common_budget() -> None:
    # trl: 4 steps (40 samples) in 200 s; ours: 2 steps (20 samples) in 50 s
    trl = record("trl", 0, [(0, 0.0, 0.2), (2, 100.0, 0.4), (4, 200.0, 0.6)])
    ours = record("async_s2", 0, [(0, 0.0, 0.2), (1, 25.0, 0.3), (2, 50.0, 0.5)])
    assert common_budget([trl, ours], "samples") == 20.0
    assert common_budget([trl, ours], "wall") == 50.0
    summary = summarize([trl, ours])
    cells = {cell.cell: cell for cell in summary.cells}
    assert [cell.cell for cell in summary.cells] == ["trl", "async_s2"]  # the table's fixed order
    # at 20 samples: trl is at its step-2 eval (0.4); ours at its last (0.5)
    assert cells["trl"].accuracy_at_equal_samples.mean == pytest.approx(0.4)
    assert cells["async_s2"].accuracy_at_equal_samples.mean == pytest.approx(0.5)
    # at 50 s: trl halfway from 0.2 (0 s) to 0.4 (100 s)
    assert cells["trl"].accuracy_at_equal_wall.mean == pytest.approx(0.3)
    assert cells["async_s2"].accuracy_at_equal_wall.mean == pytest.approx(0.5)
    assert cells["trl"].s_per_step.mean == pytest.approx(50.0) and cells["async_s2"].wall_s.mean == 50.0


def test_a_cell_summarizes_its_seeds_mean_and_spread() -> None:
    runs = [record("pull", 0, [(0, 0.0, 0.1), (2, 10.0, 0.5)]), record("pull", 1, [(0, 0.0, 0.3), (2, 20.0, 0.7)])]
    (pull,) = summarize(runs).cells
    assert pull.seeds == [0, 1]
    assert pull.accuracy_end.mean == pytest.approx(0.6) and pull.accuracy_end.sd == pytest.approx(0.1414, abs=1e-4)
    assert (pull.accuracy_start.min, pull.accuracy_start.max) == (0.1, 0.3)
    # equal wall time is seed 0's end (10 s): seed 1 is halfway to its 20 s eval there
    assert pull.accuracy_at_equal_wall.values == pytest.approx([0.5, 0.5])


def test_finished_cells_are_skipped_and_the_summary_rebuilds_from_cell_files(tmp_path: Path) -> None:
    trl = record("trl", 0, [(0, 0.0, 0.2), (2, 10.0, 0.4)])
    trl.notes.append("[grpo] dynamic_sampling ignored")
    save_record(trl, tmp_path)
    todo = cells_to_run(tmp_path, ["trl", "pull"], [0, 1])
    assert todo == [("pull", 0), ("trl", 1), ("pull", 1)]
    assert [r.key for r in load_records(tmp_path)] == ["trl_seed0"]
    table = write_summary(tmp_path).read_text()
    assert "TRL GRPOTrainer" in table and (tmp_path / "summary.json").exists() and (tmp_path / "vs_trl.png").exists()
    assert "trl: [grpo] dynamic_sampling ignored" in table  # what a system could not follow is in the table


def test_each_cell_run_file_keeps_the_held_out_split_and_sets_its_schedule(tmp_path: Path) -> None:
    base = {
        "run_id": "smollm2",
        "model": {"path": "/somewhere"},
        "task": {
            "name": "math_gym",
            "seed": 7,
            "num_eval_prompts": 20,
            "reasoning_gym_tasks": ["chain_sum"],
            "reasoning_gym_config": {"chain_sum": {"min_terms": 2, "max_digits": 2}},
        },
        "schedule": {"staleness_bound": 2, "num_steps": 40, "max_wall_s": 3000},
    }
    options = Options(
        config=tmp_path / "base.toml",
        model_dir=tmp_path / "model",
        num_steps=2,
        num_eval_prompts=8,
        engine="torch",
        workers=1,
        threads=2,
        trl_micro_batch=16,
        out=tmp_path,
        trl_python=tmp_path / "python",
        cluster_python=None,
    )
    runs = {
        cell: RunConfig.model_validate(cell_run_file(base, cell, 1, options))
        for cell in ("trl", "pull", "async_s2", "async_s2_all")
    }
    for run in runs.values():
        assert run.task.seed == 7 and run.task.prompt_seed == 1 and run.task.num_eval_prompts == 8
        assert run.schedule.num_steps == 2 and run.schedule.max_wall_s > 3000
        assert run.model.path == (tmp_path / "model").resolve() and run.rollout.engine == "torch"
    assert runs["pull"].schedule.mode == "pull" and runs["pull"].schedule.staleness_bound == 0
    assert runs["async_s2"].schedule.mode == "async" and runs["async_s2"].schedule.staleness_bound == 2
    # the equal-samples cell: async S = 2 training every group it generates, as TRL does
    assert runs["async_s2_all"].schedule.staleness_bound == 2 and not runs["async_s2_all"].grpo.dynamic_sampling
    assert runs["async_s2"].grpo.dynamic_sampling == base.get("grpo", {}).get("dynamic_sampling", False)
    assert base["schedule"]["num_steps"] == 40  # the base file's dict is not changed
    # a smoke run's --out tags its run files and run folders; the default results folder does not
    assert len(options.tag) == 8 and dataclasses.replace(options, out=OUT_DIR).tag == ""
    raw = cell_run_file(base, "pull", 1, options)
    assert tomllib.loads(dump_run_file(raw)) == raw  # inline tables (reasoning_gym_config) included


def test_our_evals_sit_at_the_samples_generated_and_wall_time_of_the_step_that_made_the_version() -> None:
    # num_dropped is cumulative by reason: by step 3, 2 flat groups skipped and 1 stale group, 8 samples each
    steps = [
        _step(1, 64, 30.0, {}),
        _step(2, 64, 50.0, {"zero_variance": 2}),
        _step(3, 64, 80.0, {"zero_variance": 2, "stale": 1}),
    ]
    evals = [_eval(0, 0.1), _eval(2, 0.3), _eval(3, 0.4), _eval(3, 0.45)]  # version 3 twice: the last counts
    points = eval_points(steps, evals, group_size=8)
    assert [(p.step, p.num_samples, p.wall_s, p.accuracy) for p in points] == [
        (0, 0, 0.0, 0.1),
        (2, 128 + 16, 50.0, 0.3),
        (3, 192 + 24, 80.0, 0.45),
    ]
    assert [p.num_trained_samples for p in step_points(steps, group_size=8)] == [64, 128, 192]


def _step(step: int, num_samples: int, wall_s: float, num_dropped: dict[str, int]) -> StepRecord:
    return step_record(step, num_samples=num_samples, wall_s=wall_s, num_dropped=num_dropped)


def _eval(version: int, accuracy: float) -> EvalRecord:
    return eval_record(version, accuracy, num_eval_prompts=4)
