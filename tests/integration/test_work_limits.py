"""What the work API bounds and what the coordinator does with its accounting (services/coordinator/work_leases.py,
work_accounting.py, work_flags.py, quarantine.py), against a real redis-server and the real coordinator under
uvicorn, with registered workers calling it over HTTP: a worker holds at most [work] max_held_tasks leases; an
expired lease goes to another credential's worker after one lease time and back to its own credential only after
a second; a worker flagged for its completion is quarantined by policy (and judged afresh after an admin's
release); a worker whose mean reward departs from the fleet's is flagged and nothing more. Leases earned with
scored groups: test_lease_allowance.py (here every new identity is trusted with max_held_tasks at once)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from shared import worker_rewards
from shared.api import WorkerState
from shared.bus import StreamBus
from shared.config import RolloutConfig, RunConfig, WorkConfig
from shared.keys import RunKeys
from shared.messages import TaskGroup
from tests.coordinator_rest import (
    ADMIN_TOKEN,
    ServeCoordinator,
    ServedCoordinator,
    bearer,
    issue_credential,
    register,
    score_groups,
)
from tests.integration.test_work_api import Worker, accounting, add_tasks, answer, assert_counters_close
from tests.manual_clock import ManualClock
from tests.polling import wait_for

pytestmark = pytest.mark.integration

LEASE_MS = 400  # the run file's rollout.claim_idle_ms
Join = Callable[..., Worker]  # join(name, join_token=None): a worker of the shared token, or of a credential


@pytest.fixture
def serve(
    serve_coordinator: ServeCoordinator, run_id: str, clock: ManualClock
) -> Iterator[Callable[..., tuple[ServedCoordinator, Join]]]:
    """serve(**work) -> the coordinator of a run with these [work] settings (new identities trusted with
    max_held_tasks unless earn_leases is given), and join(name, join_token=None) -> a registered worker."""
    clients: list[httpx.Client] = []

    def serve_run(**work: Any) -> tuple[ServedCoordinator, Join]:
        work.setdefault("earn_leases", False)
        run = RunConfig(run_id=run_id, rollout=RolloutConfig(claim_idle_ms=LEASE_MS), work=WorkConfig(**work))
        served = serve_coordinator(run, lease_clock=clock)

        def join(name: str, join_token: str | None = None) -> Worker:
            registration = register(served.client, name, join_token=join_token)
            http = httpx.Client(base_url=served.url, timeout=10, headers=bearer(registration.token))
            clients.append(http)
            return Worker(registration.worker_id, http, run_id)

        return served, join

    yield serve_run
    for http in clients:
        http.close()


def answer_all(worker: Worker, leased: list[tuple[str, TaskGroup]]) -> None:
    response = worker.submit([(lease_id, answer(task, worker.worker_id)) for lease_id, task in leased])
    assert response.refused == [] and len(response.accepted) == len(leased)


def take_expired(worker: Worker, num_tasks: int) -> list[tuple[str, TaskGroup]]:
    """`num_tasks` leases another worker let expire, as they come free."""
    taken: list[tuple[str, TaskGroup]] = []
    while len(taken) < num_tasks:
        wanted = num_tasks - len(taken)
        taken += wait_for(
            lambda wanted=wanted: worker.lease(max_groups=wanted), "expired leases", timeout_s=10, interval_s=0.05
        )
    return taken


def state_of(served: ServedCoordinator, worker: Worker) -> WorkerState:
    return WorkerState(served.client.get(f"/v1/workers/{worker.worker_id}").json()["state"])


# the cap


def test_a_worker_holds_at_most_max_held_tasks_until_it_answers_and_others_still_get_work(
    serve, bus: StreamBus
) -> None:
    served, join = serve(max_held_tasks=4)
    greedy, other = join("greedy"), join("other")
    add_tasks(bus, 10)

    first = greedy.lease(max_groups=8)
    assert len(first) == 4  # the cap, not the 8 asked for
    assert greedy.lease(max_groups=8) == []  # holding 4: nothing more, an empty answer (it backs off)
    assert len(other.lease(max_groups=8)) == 4  # the cap is per worker: the rest of the queue still flows

    answer_all(greedy, first[:2])  # two answered: room for two
    assert len(greedy.lease(max_groups=8)) == 2

    counts = assert_counters_close(served)
    assert counts.max_held == 4
    assert counts.workers[greedy.worker_id].held == 4 and counts.workers[greedy.worker_id].leased == 6


def test_a_lease_a_worker_let_expire_goes_to_another_credential_and_back_to_its_own_only_after_a_second_lease_time(
    serve, bus: StreamBus
) -> None:
    served, join = serve(max_held_tasks=4)
    dropper, honest = join("dropper", issue_credential(served.client, "dropper's operator")), join("honest")
    add_tasks(bus, 4)
    leased_at_s = time.monotonic()  # at most when Redis leased them
    held = dropper.lease(max_groups=4)

    taken: list[tuple[str, TaskGroup]] = []
    while len(taken) < 4 and time.monotonic() - leased_at_s < 10:  # both ask, the dropper first
        assert dropper.lease(max_groups=4) == []  # at the cap, and its own leases come back only after two lease times
        taken += honest.lease(max_groups=4 - len(taken))  # after one lease time: the honest worker's

    assert sorted(taken) == sorted(held) and time.monotonic() - leased_at_s >= LEASE_MS / 1000
    answer_all(honest, taken)
    counts = assert_counters_close(served).workers[dropper.worker_id]
    assert (counts.expired, counts.held) == (4, 0)


def test_a_worker_alone_gets_its_expired_leases_back_after_two_lease_times(serve, bus: StreamBus) -> None:
    served, join = serve(max_held_tasks=4)
    alone = join("alone")
    add_tasks(bus, 6)
    leased_at_s = time.monotonic()  # at most when Redis leased them
    held = alone.lease(max_groups=8)
    assert len(held) == 4

    assert alone.lease(max_groups=8) == []  # at the cap; its own leases have not expired twice
    back = wait_for(lambda: alone.lease(max_groups=8), "its own leases back", timeout_s=10, interval_s=0.05)

    assert time.monotonic() - leased_at_s >= 2 * LEASE_MS / 1000
    assert sorted(back) == sorted(held)  # the expired ones first; still at the cap, so no new task
    answer_all(alone, back)
    counts = assert_counters_close(served).workers[alone.worker_id]
    assert (counts.leased, counts.expired, counts.accepted) == (8, 4, 4)


# quarantine by policy


def drop_a_round(dropper: Worker, honest: list[Worker], bus: StreamBus, num_tasks: int, scored: Scorer) -> int:
    """`num_tasks` new tasks: the dropper leases what it may and never answers; the honest workers answer the rest
    at once and the dropper's once they expire, and the reward service scores their groups (`scored`). Returns how
    many the dropper held (each expiry halves what it may hold: test_lease_allowance.py)."""
    add_tasks(bus, num_tasks)
    held = len(dropper.lease(max_groups=num_tasks))
    answered = [0]

    def sweep() -> bool:
        for worker in honest:
            taken = worker.lease(max_groups=num_tasks)
            if taken:
                answer_all(worker, taken)
                scored(worker.worker_id, len(taken))
                answered[0] += len(taken)
        return answered[0] == num_tasks

    wait_for(sweep, "the honest workers answered every task", timeout_s=10, interval_s=0.05)
    return held


Scorer = Callable[[str, int], None]  # (worker id, groups): what the reward service records as it scores them


@pytest.fixture
def scored(redis_client: redis.Redis, keys: RunKeys) -> Scorer:
    return lambda worker_id, num_groups: score_groups(redis_client, keys, worker_id, num_groups)


def test_a_worker_flagged_for_its_completion_is_quarantined_by_policy_and_judged_afresh_after_a_release(
    serve, bus: StreamBus, scored: Scorer
) -> None:
    served, join = serve(max_held_tasks=16, quarantine_min_ended_leases=24)
    control = served.app.state.control
    # one honest worker: it answers all 32, so the fleet's median has two workers with 20 judged leases each
    dropper, honest = join("dropper", issue_credential(served.client, "dropper's")), [join("a")]
    dropped = drop_a_round(dropper, honest, bus, 16, scored) + drop_a_round(dropper, honest, bus, 16, scored)
    assert dropped == 32  # leases are not earned in this run: it holds max_held_tasks each round

    control.run_once()  # flagged (20 judged leases needed) and quarantined (24 needed) at 32
    assert set(accounting(served).flagged) == {dropper.worker_id}
    assert state_of(served, dropper) == WorkerState.QUARANTINED
    assert all(state_of(served, worker) == WorkerState.ACTIVE for worker in honest)
    add_tasks(bus, 1)
    assert dropper.lease(max_groups=1) == []  # a quarantined worker gets no task

    # its credential, all of whose work was the dropper's, is quarantined with it: the admin releases the credential
    operator_id = served.client.get(f"/v1/workers/{dropper.worker_id}").json()["operator_id"]
    release = served.client.post(f"/v1/operators/{operator_id}/release", headers=bearer(ADMIN_TOKEN))
    assert release.status_code == 200, release.text
    assert release.json()["state"] == "active" and release.json()["quarantined_worker_ids"] == []
    control.run_once()
    assert state_of(served, dropper) == WorkerState.ACTIVE  # its expired leases were before the release
    assert accounting(served).flagged == {}
    assert len(dropper.lease(max_groups=1)) == 1


def test_with_the_policy_off_a_flagged_worker_keeps_working(serve, bus: StreamBus, scored: Scorer) -> None:
    served, join = serve(max_held_tasks=16, quarantine_incomplete=False, quarantine_min_ended_leases=20)
    dropper, honest = join("dropper", issue_credential(served.client, "dropper's")), [join("a")]  # judged: 32 each
    for _ in range(2):
        drop_a_round(dropper, honest, bus, 16, scored)

    served.app.state.control.run_once()

    assert set(accounting(served).flagged) == {dropper.worker_id}
    assert state_of(served, dropper) == WorkerState.ACTIVE


# the reward flag


def record_scores(client: redis.Redis, keys: RunKeys, worker_id: str, group_means: list[float]) -> None:
    """What the reward service records when it scores groups of the worker with these mean rewards."""
    for mean in group_means:
        client.hincrbyfloat(keys.worker_rewards(worker_id), worker_rewards.NUM_GROUPS, 1)
        client.hincrbyfloat(keys.worker_rewards(worker_id), worker_rewards.REWARD_SUM, mean)
        client.hincrbyfloat(keys.worker_rewards(worker_id), worker_rewards.REWARD_SUM_SQ, mean * mean)


def test_a_worker_whose_mean_reward_departs_from_the_fleets_is_flagged_and_nothing_more(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()  # the flag's bounds: 5 standard errors, 50 groups (work_flags.py)
    honest, lucky, newcomer = [join("honest-a"), join("honest-b")], join("lucky"), join("newcomer")
    workers = [*honest, lucky, newcomer]
    add_tasks(bus, len(workers))
    for worker in workers:  # each answered a lease: a row of the accounting
        answer_all(worker, worker.lease(max_groups=1))
    means = [0.0, 0.25, 0.5, 0.75, 1.0] * 20  # honest: group means 0..1, mean 0.5, 100 groups
    for worker in honest:
        record_scores(redis_client, keys, worker.worker_id, means)
    record_scores(redis_client, keys, lucky.worker_id, [1.0] * 100)  # every group right: re-posted winners
    record_scores(redis_client, keys, newcomer.worker_id, [1.0] * 49)  # too few groups to judge

    served.app.state.control.run_once()
    books = accounting(served)

    assert set(books.reward_flagged) == {lucky.worker_id}, books.reward_flagged
    assert "above" in books.reward_flagged[lucky.worker_id]
    assert books.rewards[lucky.worker_id].num_groups == 100 and books.rewards[lucky.worker_id].mean == 1.0
    assert books.flagged == {}  # its completion is fine
    assert state_of(served, lucky) == WorkerState.ACTIVE  # a signal for an operator, never acted on
