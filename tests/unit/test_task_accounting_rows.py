"""The accounting's closing identities as pure arithmetic (cluster/accounting.py): per worker, leased =
accepted + failed + expired + held; over the workers, the leases they hold are Redis's pending tasks."""

from __future__ import annotations

from cluster.accounting import GroupAccounting, WorkerAccounting


def row(worker_id: str, **counts: int) -> WorkerAccounting:
    fields = {"num_leased": 0, "num_returned": 0, "num_accepted": 0, "num_refused": 0, "num_expired": 0}
    return WorkerAccounting(worker_id=worker_id, **{**fields, "num_failed": 0, "num_held": 0, **counts})


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
    honest = row("a", num_leased=5, num_returned=4, num_accepted=4, num_held=1)
    flaky = row(
        "b", num_leased=5, num_returned=2, num_accepted=2, num_refused=1, num_failed=1, num_expired=1, num_held=1
    )
    result = accounting([honest, flaky], num_held=2)
    assert (honest.num_unaccounted, flaky.num_unaccounted) == (0, 0)
    assert result.num_unaccounted == 0 and result.num_unaccounted_workers == 0


def test_a_lease_no_row_explains_is_counted_against_the_workers() -> None:
    lost = row("a", num_leased=5, num_accepted=3, num_held=1)  # one lease neither answered, failed nor expired
    assert lost.num_unaccounted == 1
    assert accounting([lost], num_held=1).num_unaccounted_workers == 1
    holds_too_much = row("b", num_leased=2, num_held=2)
    assert accounting([holds_too_much], num_held=1).num_unaccounted_workers == 1  # Redis holds only one
