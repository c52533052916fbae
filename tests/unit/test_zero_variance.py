"""Groups with zero reward variance (services/learner/zero_variance.py): the per-step statistic and its split
by reward, and the warning's hysteresis (not before warn_steps steps in a row, then at most every
warn_every_steps, cleared by one step below the threshold), naming the likely cause."""

from __future__ import annotations

import math

import pytest

from services.learner.zero_variance import FlatGroupTally, ZeroVarianceAlarm
from shared.flat_groups import is_flat
from shared.messages import FlatGroups, RolloutGroup, ScoredGroup, pack_float32, pack_int32


def scored(rewards: list[float], finish_reasons: list[str] | None = None) -> ScoredGroup:
    num_samples = len(rewards)
    rollout = RolloutGroup(
        run_id="r",
        group_id="g",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="3+4=",
        worker_id="w",
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32([7, 3, 8, 14]),
        completion_token_ids=pack_int32([5] * num_samples),
        completion_lengths=pack_int32([1] * num_samples),
        behaviour_logprobs=pack_float32([-1.0] * num_samples),
        completion_texts=["7"] * num_samples,
        finish_reasons=finish_reasons or ["stop"] * num_samples,
        generation_s=0.0,
    )
    return ScoredGroup(run_id="r", rollout=rollout, rewards=rewards)


def test_a_group_is_flat_when_every_sample_got_the_same_reward() -> None:
    assert is_flat([0.0, 0.0, 0.0]) and is_flat([0.1 + 0.2, 0.3, 0.3])  # float noise is not a spread
    assert not is_flat([0.0, 0.0, 0.5])


def test_the_tally_splits_flat_groups_by_the_reward_they_sit_at() -> None:
    tally = FlatGroupTally()
    tally.add(scored([0.0] * 4, ["length", "length", "stop", "length"]), skipped=False)
    tally.add(scored([0.0] * 4), skipped=True)
    tally.add(scored([1.0] * 4), skipped=True)
    tally.add(scored([0.5] * 4), skipped=False)
    tally.add(scored([1.0, 0.0, 0.0, 0.5]), skipped=False)
    flat = tally.record()

    assert flat == FlatGroups(
        num_groups=5,
        num_flat_at_zero=2,
        num_flat_at_max=1,
        num_flat_other=1,
        num_skipped=2,
        num_samples=20,
        num_samples_cut=3,
    )
    assert flat.zero_variance_fraction == pytest.approx(0.8)
    assert flat.cut_fraction == pytest.approx(0.15)
    assert flat.groups_per_trained_group == pytest.approx(5 / 3)  # dynamic sampling's cost
    assert FlatGroups().zero_variance_fraction == 0.0 and FlatGroups().groups_per_trained_group == 1.0
    assert math.isinf(FlatGroups(num_groups=4, num_flat_at_zero=4, num_skipped=4).groups_per_trained_group)
    assert FlatGroups.total([flat, flat]).num_flat_at_zero == 4


def step(num_at_zero: int, num_at_max: int = 0, num_groups: int = 10, num_cut: int = 0) -> FlatGroups:
    return FlatGroups(
        num_groups=num_groups,
        num_flat_at_zero=num_at_zero,
        num_flat_at_max=num_at_max,
        num_samples=8 * num_groups,
        num_samples_cut=num_cut,
    )


def alarm(warn_steps: int = 5, warn_every_steps: int = 50) -> ZeroVarianceAlarm:
    return ZeroVarianceAlarm(
        warn_fraction=0.9, warn_steps=warn_steps, warn_every_steps=warn_every_steps, max_new_tokens=2
    )


def test_the_warning_fires_after_warn_steps_in_a_row_not_before_and_names_the_cause() -> None:
    watch = alarm(warn_steps=5)
    assert [watch.observe(step(10)) for _ in range(4)] == [None] * 4
    assert watch.warning is None  # four steps: not yet

    warning = watch.observe(step(9, num_cut=60))  # 9 of 10 flat: at the threshold counts
    assert warning is not None and watch.warning == warning
    assert "never scores" in warning and "task format" in warning
    assert "49 all 0" in warning and "50 groups" in warning  # the last five steps together
    assert "max_new_tokens = 2" in warning  # 60 of the last 400 samples were cut: said, with the limit
    assert "always scores" not in warning


def test_one_step_below_the_threshold_resets_the_count_and_clears_the_warning() -> None:
    watch = alarm(warn_steps=3)
    for _ in range(2):
        watch.observe(step(10))
    assert watch.observe(step(8)) is None  # 80% < 90%: the streak ends
    assert [watch.observe(step(10)) for _ in range(2)] == [None, None]
    assert watch.observe(step(10)) is not None
    watch.observe(step(0))
    assert watch.warning is None and watch.num_steps_above == 0


def test_the_warning_repeats_at_most_every_warn_every_steps() -> None:
    watch = alarm(warn_steps=2, warn_every_steps=4)
    fired_at = [index for index in range(1, 13) if watch.observe(step(10)) is not None]
    assert fired_at == [2, 6, 10]


def test_the_cause_follows_the_split_always_scores_or_a_partial_reward() -> None:
    watch = alarm(warn_steps=1)
    always = watch.observe(step(1, num_at_max=9))
    assert always is not None and "always scores" in always and "never scores" not in always
    other = alarm(warn_steps=1).observe(FlatGroups(num_groups=10, num_flat_other=10, num_samples=80))
    assert other is not None and "same partial reward" in other


def test_under_dynamic_sampling_the_warning_says_what_skipping_costs() -> None:
    watch = alarm(warn_steps=1)
    skipping = watch.observe(FlatGroups(num_groups=40, num_flat_at_zero=36, num_skipped=36, num_samples=320))
    assert skipping is not None and "10.0 groups generated per group trained" in skipping
    # it still trains on the 4 groups with a spread: the warning must not call the run stalled
    assert "not learning" not in skipping and "the policy learns" in skipping and "trained the 4 others" in skipping
    starved = alarm(warn_steps=1).observe(FlatGroups(num_groups=10, num_flat_at_zero=10, num_skipped=10))
    assert starved is not None and "the batch cannot fill" in starved and "not learning" in starved
