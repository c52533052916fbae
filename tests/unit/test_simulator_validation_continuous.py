"""The validation hook for continuous runs (simulator/validation.py): completion lengths and each worker's
decode step from scored groups, and a continuous run predicted row by row while batch runs keep their model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shared.config import RunConfig, load_run_config
from shared.messages import RolloutGroup, ScoredGroup, pack_float32, pack_int32
from simulator.validation import MeasuredRun, engine_model, measure_lengths, predict


def scored(worker_id: str, lengths: list[int], generation_s: float) -> ScoredGroup:
    num_tokens = sum(lengths)
    rollout = RolloutGroup(
        run_id="r",
        group_id="g",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="p",
        worker_id=worker_id,
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32([4, 14]),
        completion_token_ids=pack_int32([7] * num_tokens),
        completion_lengths=pack_int32(lengths),
        behaviour_logprobs=pack_float32([-0.5] * num_tokens),
        completion_texts=["x"] * len(lengths),
        finish_reasons=["stop"] * len(lengths),
        generation_s=generation_s,
    )
    return ScoredGroup(run_id="r", rollout=rollout, rewards=[0.0] * len(lengths))


def test_lengths_and_decode_steps_come_from_the_scored_groups() -> None:
    groups = [
        scored("a", [2, 4], 0.4),  # its longest sample took 4 steps: 0.1 s a step
        scored("a", [6, 8], 0.8),
        scored("b", [4, 4], 2.0),  # a slower worker: 0.5 s a step
    ]
    measured = measure_lengths(groups)
    mean_tokens = 28 / 6
    assert measured["mean_completion_tokens"] == pytest.approx(mean_tokens, abs=1e-3)
    assert measured["length_factors"] == pytest.approx([n / mean_tokens for n in (2, 4, 4, 4, 6, 8)], abs=1e-4)
    assert measured["decode_step_s"] == pytest.approx({"a": 0.1, "b": 0.5})
    assert measured["group_generation_s"] == pytest.approx(3.2 / 3)


def test_many_samples_are_kept_as_equal_probability_quantiles() -> None:
    groups = [scored("a", [n, n + 1], 1.0) for n in range(1, 500)]
    factors = measure_lengths(groups)["length_factors"]
    assert len(factors) == 100
    assert list(factors) == sorted(factors)
    assert sum(factors) / len(factors) == pytest.approx(1.0, abs=0.02)


def continuous_run(repo_root: Path) -> RunConfig:
    run = load_run_config(repo_root / "benchmarks" / "simulator_validation.toml")
    return run.model_copy(
        update={"rollout": run.rollout.model_copy(update={"batching": "continuous", "continuous_max_rows": 16})}
    )


def measured_run(**overrides: object) -> MeasuredRun:
    base = MeasuredRun(
        run_id="r",
        num_workers=2,
        staleness_bound=2,
        publish_every=1,
        num_steps=30,
        utilization=0.5,
        train_s=0.2,
        step_overhead_s=0.02,
        idle_s=0.2,
        read_s=0.01,
        worker_samples_per_s={"worker-0": 40.0, "worker-1": 40.0},
        group_latency_s=0.05,
        broadcast_s=0.05,
        max_trained_staleness=2,
        engine_samples_per_s={"w0": 100.0, "w1": 100.0},
        batching="continuous",
        mean_completion_tokens=8.0,
        length_factors=(0.25, 0.5, 1.0, 1.0, 2.25),
        decode_step_s={"w0": 0.01, "w1": 0.04},
        group_generation_s=0.3,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_a_continuous_run_is_modelled_as_rows_of_its_measured_step_time(repo_root: Path) -> None:
    engine = engine_model(continuous_run(repo_root), measured_run())
    # R = 16 rows; a mean row is 8 tokens of 0.01 s (worker w0) or 0.04 s (w1)
    assert engine.rates == pytest.approx({"w0": 16 / 0.08, "w1": 16 / 0.32})
    assert engine.continuous and engine.length_factors == (0.25, 0.5, 1.0, 1.0, 2.25)


def test_batch_runs_keep_their_engine_fit_and_ignore_the_lengths(repo_root: Path) -> None:
    run = load_run_config(repo_root / "benchmarks" / "simulator_validation.toml")
    assert run.rollout.batching == "batch"
    engine = engine_model(run, measured_run(batching="batch"))
    assert engine.rates == {"w0": 100.0, "w1": 100.0}
    assert not engine.continuous and engine.length_factors == ()


def test_predict_simulates_a_continuous_run_in_continuous_mode(repo_root: Path) -> None:
    row = predict(continuous_run(repo_root), measured_run(), reward_poll_s=0.05, max_groups_per_batch=16)
    assert row["assumed"]["batching"] == "continuous"
    assert row["assumed"]["engine"] == "rows: R / (mean tokens * step_s)"
    assert 0 < row["simulated_utilization"] <= 1
    assert row["simulated_max_staleness"] <= 2
