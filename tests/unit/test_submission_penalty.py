"""A worker that sent a garbage submission body is refused unread for a while, doubling per strike, cleared by a
clean submission (services/coordinator/submission_penalty.py)."""

from __future__ import annotations

import pytest

from services.coordinator.submission_penalty import PENALTY_BASE_S, PENALTY_MAX_S, SubmissionPenalties
from tests.manual_clock import ManualClock


def test_strikes_double_the_penalty_up_to_its_cap_and_a_clean_submission_clears_them() -> None:
    clock = ManualClock(0.0)
    penalties = SubmissionPenalties(clock=clock)
    assert penalties.wait_s("w-bomber") is None

    assert [penalties.strike("w-bomber") for _ in range(3)] == [PENALTY_BASE_S, 2 * PENALTY_BASE_S, 4 * PENALTY_BASE_S]
    assert penalties.wait_s("w-bomber") == pytest.approx(4 * PENALTY_BASE_S)
    assert penalties.wait_s("w-honest") is None  # nobody else is held back
    clock.advance(4 * PENALTY_BASE_S)
    assert penalties.wait_s("w-bomber") is None
    for _ in range(20):
        penalties.strike("w-bomber")
    assert penalties.wait_s("w-bomber") == pytest.approx(PENALTY_MAX_S)
    penalties.clear("w-bomber")
    assert penalties.wait_s("w-bomber") is None and penalties.strike("w-bomber") == PENALTY_BASE_S
    assert penalties.num_refused == 2


def test_past_the_bound_the_least_recently_struck_are_forgotten() -> None:
    penalties = SubmissionPenalties(clock=ManualClock(0.0), max_tracked=2)
    for worker_id in ("a", "b", "c"):
        penalties.strike(worker_id)
    assert penalties.wait_s("a") is None and penalties.wait_s("c") is not None
