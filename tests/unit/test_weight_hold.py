"""The ablation's knob (services/rollout/weight_hold.py) and the run-file rules of pull mode."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from services.rollout.weight_hold import WeightHold
from shared.config import RunConfig


def test_off_releases_every_swap() -> None:
    hold = WeightHold(0)
    assert not hold.active
    assert hold.releases(engine_version=3, newest_version=4)


def test_the_first_weights_are_never_held() -> None:
    hold = WeightHold(5, seed=0)
    assert hold.releases(engine_version=-1, newest_version=0)
    assert hold.releases(engine_version=2, newest_version=None)


def test_a_worker_holds_its_weights_until_the_newest_is_more_than_the_drawn_lag_ahead() -> None:
    hold = WeightHold(3, seed=1)
    h = hold.hold_versions
    assert not hold.releases(engine_version=10, newest_version=10 + h)
    assert hold.releases(engine_version=10, newest_version=11 + h)


def test_the_held_lag_is_uniform_over_zero_to_the_max() -> None:
    hold = WeightHold(3, seed=2)
    draws = Counter()
    for _ in range(4000):
        hold.redraw()
        draws[hold.hold_versions] += 1
    assert set(draws) == {0, 1, 2, 3}
    assert all(900 < count < 1100 for count in draws.values()), draws


def test_pull_mode_asks_one_batch_at_a_time_and_refuses_what_contradicts_it() -> None:
    run = RunConfig.model_validate({"schedule": {"mode": "pull", "staleness_bound": 4}, "grpo": {"groups_per_step": 7}})
    assert run.max_groups_in_flight == 7
    with pytest.raises(ValidationError, match="publish_every = 1"):
        RunConfig.model_validate({"schedule": {"mode": "pull", "publish_every": 2}})
    with pytest.raises(ValidationError, match="hold_versions_max must be 0"):
        RunConfig.model_validate({"schedule": {"mode": "pull"}, "rollout": {"hold_versions_max": 2}})
