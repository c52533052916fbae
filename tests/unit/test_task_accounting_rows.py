"""The accounting's closing identities as pure arithmetic (cluster/accounting.py): per worker, leased =
accepted + failed + expired + held; over the workers, the leases they hold are Redis's pending tasks."""

from __future__ import annotations

from cluster.accounting import GroupAccounting, WorkerAccounting
from shared.api import WorkCounts
from shared.work_counts import COUNTERS, JUDGED


def row(worker_id: str, **counts: int) -> WorkerAccounting:
    return WorkerAccounting(worker_id=worker_id, **counts)


def accounting(workers: list[WorkerAccounting], num_held: int) -> GroupAccounting:
    return GroupAccounting(
        num_tasks_issued=10,
        num_produced=6,
        num_scored=6,
        num_trained=6,
        num_dropped={},
        num_dead_lettered_work=1,
        num_dead_lettered_reward=0,
        num_dead_lettered_learner=0,
        num_held=num_held,
        num_unleased=10 - 6 - 1 - num_held,
        num_pending_reward=0,
        num_pending_learner=0,
        workers=workers,
    )


def test_every_lease_of_every_worker_is_accounted_for() -> None:
    honest = row("a", leased=5, returned=4, accepted=4, held=1)
    flaky = row("b", leased=5, returned=2, accepted=2, refused=1, failed=1, expired=1, held=1)
    result = accounting([honest, flaky], num_held=2)
    assert (honest.num_unaccounted, flaky.num_unaccounted) == (0, 0)
    assert result.num_unaccounted == 0 and result.num_unaccounted_workers == 0


def test_a_lease_no_row_explains_is_counted_against_the_workers() -> None:
    lost = row("a", leased=5, accepted=3, held=1)  # one lease neither answered, failed nor expired
    assert lost.num_unaccounted == 1
    assert accounting([lost], num_held=1).num_unaccounted_workers == 1
    holds_too_much = row("b", leased=2, held=2)
    assert accounting([holds_too_much], num_held=1).num_unaccounted_workers == 1  # Redis holds only one


def test_the_counts_record_is_the_counters_stored_the_leases_held_and_the_reward_services_judgement() -> None:
    # a counter added to WorkCounter without its field (or the reverse) would be read by nobody
    assert set(WorkCounts.model_fields) == {*COUNTERS, "held", *JUDGED}
    assert set(WorkerAccounting.model_fields) == {*WorkCounts.model_fields, "worker_id"}
