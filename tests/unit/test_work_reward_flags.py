"""A worker whose mean group reward departs from the rest of the fleet's by more than the stated number of
standard errors is flagged (services/coordinator/work_flags.py reward_outliers); honest sampling noise,
too few groups, or a fleet too small to say who is the odd one flag nobody."""

from __future__ import annotations

import random

from services.coordinator.work_flags import reward_outliers, since_release
from shared.work_api import RewardStats, WorkCounts


def stats(group_means: list[float]) -> RewardStats:
    return RewardStats(
        num_groups=len(group_means), reward_sum=sum(group_means), reward_sum_sq=sum(m * m for m in group_means)
    )


def honest_groups(rng: random.Random, num_groups: int, p: float = 0.5, group_size: int = 8) -> list[float]:
    """Group means of `group_size` samples, each right with probability `p`."""
    return [sum(rng.random() < p for _ in range(group_size)) / group_size for _ in range(num_groups)]


def test_honest_workers_on_the_same_tasks_are_not_flagged() -> None:
    rng = random.Random(0)
    for _ in range(20):  # 20 fleets of 30 honest workers, 200 groups each
        fleet = {f"w{i}": stats(honest_groups(rng, 200)) for i in range(30)}
        assert reward_outliers(fleet, num_standard_errors=5.0, min_groups=50) == {}


def test_a_worker_above_or_below_the_fleet_is_flagged_and_does_not_drag_honest_ones_with_it() -> None:
    rng = random.Random(1)
    fleet = {f"honest-{i}": stats(honest_groups(rng, 200)) for i in range(3)}
    fleet["lucky"] = stats([1.0] * 200)  # only winning groups: re-posted or cherry-picked
    fleet["saboteur"] = stats(honest_groups(rng, 200, p=0.2))

    flagged = reward_outliers(fleet, num_standard_errors=5.0, min_groups=50)

    assert set(flagged) == {"lucky", "saboteur"}
    assert "above" in flagged["lucky"] and "below" in flagged["saboteur"]


def test_too_few_groups_or_peers_flag_nobody() -> None:
    rng = random.Random(2)
    fleet = {f"honest-{i}": stats(honest_groups(rng, 200)) for i in range(3)}
    assert reward_outliers({**fleet, "young": stats([1.0] * 49)}, num_standard_errors=5.0, min_groups=50) == {}
    pair = {"a": stats(honest_groups(rng, 200)), "b": stats([1.0] * 200)}  # which of two is the odd one?
    assert reward_outliers(pair, num_standard_errors=5.0, min_groups=50) == {}


def test_completion_is_judged_on_the_leases_ended_since_the_release() -> None:
    before = WorkCounts(leased=40, accepted=2, expired=38)
    now = WorkCounts(leased=60, returned=20, accepted=22, expired=38, held=3)

    since = since_release(now, before)

    assert (since.accepted, since.expired, since.num_decided, since.held) == (20, 0, 20, 3)
    assert since_release(now, None) == now
