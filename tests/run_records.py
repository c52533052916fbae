"""StepRecord / EvalRecord / LearnerState with neutral values for the fields a test does not care about: the report and
benchmark-summary tests name only the fields they check."""

from __future__ import annotations

from typing import Any

from shared.messages import LearnerState
from shared.run_records import EvalRecord, StepRecord

STEP_DEFAULTS: dict[str, Any] = {
    "train_s": 1.0,
    "idle_s": 0.0,
    "publish_s": 0.0,
    "reward_mean": 0.5,
    "reward_std": 0.1,
    "staleness_histogram": {"0": 8},
    "max_staleness": 0,
    "num_dropped": {},
    "num_dead_lettered": 0,
    "num_groups": 8,
    "num_samples": 64,
    "num_tokens": 100,
    "num_replayed_groups": 0,
    "loss": 0.0,
    "ratio_mean": 1.0,
    "clip_fraction": 0.0,
    "truncated_fraction": 0.0,
    "approx_kl": 0.0,
    "grad_norm": 1.0,
}


def step_record(step: int, **fields: Any) -> StepRecord:
    """Step `step` (its version too, wall_s = step unless given) with `fields` over the defaults."""
    return StepRecord(**{"step": step, "policy_version": step, "wall_s": float(step), **STEP_DEFAULTS, **fields})


def eval_record(version: int, accuracy: float, **fields: Any) -> EvalRecord:
    values = {"eval_reward_mean": accuracy, "num_eval_prompts": 10, "eval_s": 1.0, "wall_s": 1.0, **fields}
    return EvalRecord(eval_step=version, eval_accuracy=accuracy, **values)


def learner_state(learner_version: int = 3, **fields: Any) -> LearnerState:
    """A training learner at `learner_version` (published too) with `fields` over neutral values."""
    values = {"run_id": "r", "status": "training", "published_version": learner_version, "staleness_bound": 2}
    return LearnerState(**{**values, "learner_version": learner_version, "num_steps_target": 100, **fields})
