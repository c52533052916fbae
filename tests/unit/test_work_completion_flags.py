"""A worker whose completion ratio departs from the fleet's is flagged in the work accounting
(services/coordinator/work_flags.py completion_outliers): one that leases tasks and lets them expire."""

from __future__ import annotations

from services.coordinator.work_flags import MIN_DECIDED_LEASES, completion_outliers
from shared.work_api import WorkCounts


def counts(accepted: int, expired: int = 0, failed: int = 0, held: int = 0) -> WorkCounts:
    leased = accepted + expired + failed + held
    return WorkCounts(leased=leased, returned=accepted, accepted=accepted, expired=expired, failed=failed, held=held)


def test_a_worker_that_lets_its_leases_expire_is_flagged_and_honest_ones_are_not() -> None:
    fleet = {"honest-a": counts(95, expired=5), "honest-b": counts(90, expired=10), "dropper": counts(3, expired=97)}

    flagged = completion_outliers(fleet)

    assert set(flagged) == {"dropper"}
    assert "completion ratio 0.03" in flagged["dropper"] and "3 accepted of 100" in flagged["dropper"]


def test_too_few_ended_leases_or_no_peers_flag_nobody() -> None:
    young = MIN_DECIDED_LEASES - 1
    assert completion_outliers({"honest": counts(100), "newcomer": counts(0, expired=young)}) == {}
    assert completion_outliers({"alone": counts(0, expired=100)}) == {}  # a fleet of one has no peers
    assert completion_outliers({"a": counts(50, held=40), "b": counts(48, held=2)}) == {}  # held leases have not ended


def test_a_fleet_that_completes_alike_flags_nobody() -> None:
    fleet = {f"w{i}": counts(80 + i, expired=20 - i) for i in range(10)}
    assert completion_outliers(fleet) == {}
