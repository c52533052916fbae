"""A worker whose lease call got nothing because it, or its credential, held all it may is answered empty for a
while, doubling per further full answer up to its cap, cleared by an answer or a failure report
(services/coordinator/lease_pacing.py)."""

from __future__ import annotations

from services.coordinator.lease_pacing import CREDENTIAL_HOLD_MAX_S, HOLD_BASE_S, Full, LeasePacing
from tests.manual_clock import ManualClock

LEASE_S = 8.0


def test_full_answers_double_the_hold_up_to_half_a_lease_time_and_an_answer_clears_it() -> None:
    clock = ManualClock(0.0)
    pacing = LeasePacing(LEASE_S, clock=clock)

    assert pacing.note("w-hoarder", Full.NOT) is None and not pacing.answer_early("w-hoarder")
    holds = [pacing.note("w-hoarder", Full.OWN) for _ in range(6)]
    assert holds == [HOLD_BASE_S, 2 * HOLD_BASE_S, 4 * HOLD_BASE_S, 8 * HOLD_BASE_S, LEASE_S / 2, LEASE_S / 2]
    assert pacing.answer_early("w-hoarder") and not pacing.answer_early("w-honest")  # nobody else is held
    clock.advance(LEASE_S / 2)
    assert not pacing.answer_early("w-hoarder")  # the hold ran out: its next call goes through
    pacing.note("w-hoarder", Full.OWN)
    pacing.clear("w-hoarder")  # it answered a lease
    assert not pacing.answer_early("w-hoarder") and pacing.note("w-hoarder", Full.OWN) == HOLD_BASE_S
    assert pacing.num_answered_early == 1


def test_a_full_credential_holds_its_identity_no_longer_than_a_second() -> None:
    pacing = LeasePacing(LEASE_S, clock=ManualClock(0.0))
    holds = [pacing.note("w-sibling", Full.CREDENTIAL) for _ in range(5)]
    assert max(holds) == CREDENTIAL_HOLD_MAX_S < LEASE_S / 2


def test_past_the_bound_the_least_recently_held_are_forgotten() -> None:
    pacing = LeasePacing(LEASE_S, clock=ManualClock(0.0), max_tracked=2)
    for worker_id in ("a", "b", "c"):
        pacing.note(worker_id, Full.OWN)
    assert not pacing.answer_early("a") and pacing.answer_early("c")
