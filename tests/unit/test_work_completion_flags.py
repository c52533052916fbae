"""A worker whose completion ratio departs from the fleet's is flagged in the work accounting
(services/coordinator/work_flags.py completion_outliers): one that leases tasks and lets them expire, or answers
them with groups the reward service refuses (an answer counts as completed only once it is scored)."""

from __future__ import annotations

from services.coordinator.work_flags import MIN_DECIDED_LEASES, completion_outliers
from shared.work_api import WorkCounts


def counts(accepted: int, expired: int = 0, failed: int = 0, held: int = 0, rejected: int = 0) -> WorkCounts:
    """Counts of a worker whose accepted groups were all judged by the reward service: `rejected` of them refused."""
    leased = accepted + expired + failed + held
    return WorkCounts(
        leased=leased,
        returned=accepted,
        accepted=accepted,
        expired=expired,
        failed=failed,
        held=held,
        scored=accepted - rejected,
        rejected=rejected,
    )


def test_a_worker_that_lets_its_leases_expire_is_flagged_and_honest_ones_are_not() -> None:
    fleet = {"honest-a": counts(95, expired=5), "honest-b": counts(90, expired=10), "dropper": counts(3, expired=97)}

    flagged = completion_outliers(fleet)

    assert set(flagged) == {"dropper"}
    assert "completion ratio 0.03" in flagged["dropper"] and "3 scored of 100" in flagged["dropper"]


def test_a_worker_whose_answers_the_reward_service_refuses_is_flagged_though_the_work_api_accepted_them() -> None:
    fleet = {"honest-a": counts(95, expired=5), "honest-b": counts(90, expired=10), "garbage": counts(100, rejected=98)}

    flagged = completion_outliers(fleet)

    assert set(flagged) == {"garbage"}
    assert "98 answers refused by the reward service" in flagged["garbage"]


def test_accepted_answers_not_judged_yet_count_for_neither_side() -> None:
    waiting = WorkCounts(leased=60, returned=60, accepted=60, scored=20)  # 40 accepted, not scored yet
    assert waiting.num_judged == 20 and waiting.completion_ratio == 1.0


def test_too_few_ended_leases_or_no_peers_flag_nobody() -> None:
    young = MIN_DECIDED_LEASES - 1
    assert completion_outliers({"honest": counts(100), "newcomer": counts(0, expired=young)}) == {}
    assert completion_outliers({"alone": counts(0, expired=100)}) == {}  # a fleet of one has no peers
    assert completion_outliers({"a": counts(50, held=40), "b": counts(48, held=2)}) == {}  # held leases have not ended


def test_a_fleet_that_completes_alike_flags_nobody() -> None:
    fleet = {f"w{i}": counts(80 + i, expired=20 - i) for i in range(10)}
    assert completion_outliers(fleet) == {}
