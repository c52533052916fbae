"""Leases are earned (services/coordinator/work_scripts.py): a new identity and a new credential may hold
INITIAL_ALLOWANCE leases; each group the reward service scores adds one, each lease let expire halves it (once
per lease time); identities of one credential hold together what the credential earned; what an identity still
earning holds is speculative (the task feed issues beyond its window), never counts toward dead-lettering a
task, and a task it fails goes back to others; a quarantined credential stops every live identity it holds.
A real redis-server, the real coordinator under uvicorn, workers calling the work API over HTTP; the reward
service's scoring is recorded as it would record it (tests/coordinator_rest.py score_groups)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from services.coordinator.work_scripts import INITIAL_ALLOWANCE, MAX_LEASES_PER_TASK
from services.reward.task_feed import groups_in_flight
from shared.api import WorkerState
from shared.bus import StreamBus
from shared.config import CredentialConfig, RolloutConfig, RunConfig, WorkConfig
from shared.keys import RunKeys
from shared.messages import TaskGroup
from shared.streams import DEAD, LEARNER_STATE, TASKS
from shared.work_api import FAILURES_PATH
from tests.coordinator_rest import (
    ADMIN_TOKEN,
    JOIN_TOKEN,
    ServeCoordinator,
    ServedCoordinator,
    bearer,
    issue_credential,
    register,
    score_groups,
)
from tests.integration.test_quarantine import learner_state, trust
from tests.integration.test_work_api import Worker, accounting, add_tasks, answer, assert_counters_close
from tests.manual_clock import ManualClock
from tests.polling import wait_for

pytestmark = pytest.mark.integration

LEASE_MS = 400
MAX_HELD = 16
Join = Callable[..., Worker]  # join(name, join_token=None)


@pytest.fixture
def serve(
    serve_coordinator: ServeCoordinator, run_id: str, clock: ManualClock
) -> Iterator[Callable[..., tuple[ServedCoordinator, Join]]]:
    """serve(work=..., credentials=...) -> the coordinator of a run (leases earned, max_held_tasks 16), and join."""
    clients: list[httpx.Client] = []

    def serve_run(**sections: Any) -> tuple[ServedCoordinator, Join]:
        run = RunConfig(
            run_id=run_id,
            rollout=RolloutConfig(claim_idle_ms=LEASE_MS),
            work=sections.pop("work", WorkConfig(max_held_tasks=MAX_HELD)),
            **sections,
        )
        served = serve_coordinator(run, lease_clock=clock)

        def join(name: str, join_token: str | None = None) -> Worker:
            registration = register(served.client, name, join_token=join_token)
            http = httpx.Client(
                base_url=served.url, timeout=10, headers={"Authorization": f"Bearer {registration.token}"}
            )
            clients.append(http)
            return Worker(registration.worker_id, http, run_id)

        return served, join

    yield serve_run
    for http in clients:
        http.close()


def answer_all(worker: Worker, leased: list[tuple[str, TaskGroup]]) -> None:
    response = worker.submit([(lease_id, answer(task, worker.worker_id)) for lease_id, task in leased])
    assert response.refused == [] and len(response.accepted) == len(leased)


def speculative(redis_client: redis.Redis, keys: RunKeys) -> set[str]:
    return {member.decode() for member in redis_client.smembers(keys.work_speculative)}


def credential_field(redis_client: redis.Redis, keys: RunKeys, credential_id: str, name: str) -> float:
    return float(redis_client.hget(keys.credential_work(credential_id), name) or 0)


def take_as_they_expire(workers: list[Worker], num_tasks: int) -> dict[str, list[tuple[str, TaskGroup]]]:
    """`workers` lease and answer until they took `num_tasks`, polling (leases another worker lets expire come
    free a lease time after it took them). Returns what each took, by worker id."""
    taken: dict[str, list[tuple[str, TaskGroup]]] = {worker.worker_id: [] for worker in workers}

    def sweep() -> bool:
        for worker in workers:
            missing = num_tasks - sum(map(len, taken.values()))
            got = worker.lease(max_groups=missing) if missing > 0 else []
            if got:
                answer_all(worker, got)
                taken[worker.worker_id] += got
        return sum(map(len, taken.values())) >= num_tasks

    wait_for(sweep, f"{num_tasks} tasks taken and answered", timeout_s=15, interval_s=0.05)
    return taken


def earn_full_allowance(worker: Worker, bus: StreamBus) -> None:
    """Lease, answer and have scored batches until the worker holds MAX_HELD at once (slow start). Leaves no task
    queued that was not there before."""
    for _ in range(6):
        add_tasks(bus, MAX_HELD - bus.group_progress(TASKS)[0])
        leased = worker.lease(max_groups=MAX_HELD)
        answer_all(worker, leased)
        score_groups(bus.redis, bus.keys, worker.worker_id, len(leased))
        if len(leased) == MAX_HELD:
            return
    raise AssertionError("the worker never reached its full allowance")


def test_a_new_worker_starts_with_two_leases_and_doubles_them_with_every_scored_batch(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()
    newcomer = join("newcomer")
    add_tasks(bus, 64)

    granted = []
    for _ in range(5):
        leased = newcomer.lease(max_groups=MAX_HELD)
        granted.append(len(leased))
        was_speculative = {lease_id for lease_id, _ in leased} <= speculative(redis_client, keys)
        answer_all(newcomer, leased)
        score_groups(redis_client, keys, newcomer.worker_id, len(leased))
        if len(leased) < MAX_HELD:
            assert was_speculative  # still earning: what it holds is issued again beside the window

    assert granted == [INITIAL_ALLOWANCE, 4, 8, MAX_HELD, MAX_HELD]  # slow start, then the cap
    assert speculative(redis_client, keys) == set()  # answered leases leave the set
    assert credential_field(redis_client, keys, "", "scored") == sum(granted[:-1])  # the credential's record
    assert_counters_close(served)


def test_a_worker_holding_all_it_may_is_answered_empty_at_the_door_until_it_answers(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()
    pacing = served.app.state.coordinator.lease_pacing
    hoarder = join("hoarder")
    add_tasks(bus, 16)
    held = hoarder.lease(max_groups=MAX_HELD)
    assert len(held) == INITIAL_ALLOWANCE

    assert hoarder.lease(max_groups=MAX_HELD) == []  # the script finds it full: its next calls are held
    assert [hoarder.lease(max_groups=MAX_HELD) for _ in range(3)] == [[], [], []]
    assert pacing.num_answered_early == 3  # answered at the coordinator's door, without the lease script
    assert (
        f"coordinator_leases_answered_early_total {pacing.num_answered_early}.0" in served.client.get("/metrics").text
    )
    assert int(redis_client.hget(keys.work_counts(hoarder.worker_id), "leased") or 0) == INITIAL_ALLOWANCE

    answer_all(hoarder, held)  # an answer clears the hold: the next call reaches the script at once
    score_groups(redis_client, keys, hoarder.worker_id, len(held))
    assert len(hoarder.lease(max_groups=MAX_HELD)) == 2 * INITIAL_ALLOWANCE
    assert pacing.num_answered_early == 3


def test_answers_the_reward_service_has_not_scored_or_refused_earn_nothing(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()
    garbage = join("garbage")
    add_tasks(bus, 8)

    first = garbage.lease(max_groups=MAX_HELD)
    answer_all(garbage, first)  # accepted by the work API, not scored yet
    second = garbage.lease(max_groups=MAX_HELD)
    answer_all(garbage, second)
    score_groups(redis_client, keys, garbage.worker_id, 0, rejected=len(first) + len(second))  # refused, all
    third = garbage.lease(max_groups=MAX_HELD)

    assert [len(first), len(second), len(third)] == [INITIAL_ALLOWANCE] * 3
    assert credential_field(redis_client, keys, "", "rejected") == 2 * INITIAL_ALLOWANCE
    counts = accounting(served).workers[garbage.worker_id]
    assert counts.accepted == 4 and counts.rejected == 4 and counts.completion_ratio == 0.0


def test_expired_leases_halve_the_allowance_of_their_worker_and_credential_once_per_lease_time(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()
    dropper = join("dropper")
    earn_full_allowance(dropper, bus)
    proven = join("proven", issue_credential(served.client, "other operator"))
    earn_full_allowance(proven, bus)
    add_tasks(bus, MAX_HELD)
    held = dropper.lease(max_groups=MAX_HELD)
    assert len(held) == MAX_HELD
    shared_before = credential_field(redis_client, keys, "", "allowance")

    taken = take_as_they_expire([proven], MAX_HELD)[proven.worker_id]  # another credential's, after one lease time

    assert sorted(taken) == sorted(held)
    counts = redis_client.hgetall(keys.work_counts(dropper.worker_id))
    assert int(counts[b"expired"]) == MAX_HELD and float(counts[b"allowance"]) == MAX_HELD / 2  # halved once
    assert credential_field(redis_client, keys, "", "allowance") == shared_before // 2
    add_tasks(bus, MAX_HELD)
    assert len(dropper.lease(max_groups=MAX_HELD)) == MAX_HELD // 2


def test_identities_of_one_credential_hold_together_what_it_has_earned(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()
    token = issue_credential(served.client, "operator")
    first, sibling = join("first", token), join("sibling", token)
    add_tasks(bus, 32)

    leased = first.lease(max_groups=MAX_HELD)
    assert len(leased) == INITIAL_ALLOWANCE
    assert sibling.lease(max_groups=MAX_HELD) == []  # the credential's two are held by the first
    answer_all(first, leased)
    score_groups(redis_client, keys, first.worker_id, len(leased))
    assert len(first.lease(max_groups=MAX_HELD)) == INITIAL_ALLOWANCE * 2  # folded at its lease: 4 for both
    late = join("late", token)
    assert late.lease(max_groups=MAX_HELD) == []  # a fresh identity inherits the credential's record, all held


def test_a_credential_holds_no_more_than_its_budget_of_leases(serve, bus: StreamBus) -> None:
    served, join = serve(work=WorkConfig(max_held_tasks=MAX_HELD, earn_leases=False))
    token = issue_credential(served.client, "small", max_leases=5)
    a, b = join("a", token), join("b", token)
    add_tasks(bus, 12)

    assert len(a.lease(max_groups=4)) == 4
    assert len(b.lease(max_groups=4)) == 1  # 5 together
    assert len(join("outsider").lease(max_groups=4)) == 4  # another credential's budget is its own


def test_a_credential_over_its_share_of_the_window_gets_no_more(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve(work=WorkConfig(max_held_tasks=MAX_HELD, earn_leases=False))
    token = issue_credential(served.client, "hoarder")
    hoarder = join("hoarder", token)
    operator_id = token.partition(".")[0]
    redis_client.hset(keys.credential_work(operator_id), "share", 3)  # as the control loop sets it
    add_tasks(bus, 8)

    assert len(hoarder.lease(max_groups=8)) == 3


def test_shares_follow_each_credentials_verified_throughput(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, _ = serve(data={"max_groups_in_flight": 64})
    books = served.app.state.control.credentials
    fast, slow = "op-fast", "op-slow"
    assert books.set_shares([fast, slow], now_s=1000.0) == {}  # nothing scored yet: no shares
    for credential_id, num_groups in ((fast, 300), (slow, 100)):
        redis_client.hset(keys.credential_work(credential_id), "scored", num_groups)

    shares = books.set_shares([fast, slow], now_s=1010.0)

    assert shares[fast] == 72 and shares[slow] == 32  # 1.5 x 64 x 3/4; x 1/4 is under an equal split, 64 / 2
    assert int(redis_client.hget(keys.credential_work(fast), "share")) == 72
    assert books.set_shares([fast], now_s=1020.0) == {}  # alone: no share
    assert not redis_client.hexists(keys.credential_work(fast), "share")

    redis_client.set(keys.feed_window, 128)  # the feed widened its window (dynamic sampling skips half)
    for credential_id, num_groups in ((fast, 600), (slow, 200)):
        redis_client.hset(keys.credential_work(credential_id), "scored", num_groups)
    shares = books.set_shares([fast, slow], now_s=1030.0)
    # from the window in force, not the run's 64: slow's rate restarts (it left), so fast has 1.5 x 128 and slow
    # an equal split of 128
    assert shares[fast] == 192 and shares[slow] == 64


def test_leases_of_workers_still_earning_are_issued_again_beside_the_window(serve, bus: StreamBus) -> None:
    served, join = serve()
    add_tasks(bus, 10)
    join("newcomer").lease(max_groups=MAX_HELD)

    assert bus.group_progress(TASKS) == (8, 2)  # 8 queued, 2 leased
    assert groups_in_flight(bus) == 8  # the 2 speculative leases are not counted: the feed issues 2 more


def test_a_task_passed_among_unproven_workers_is_never_dead_lettered(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()
    proven = join("proven", issue_credential(served.client, "honest"))
    earn_full_allowance(proven, bus)
    droppers = [
        join(f"sybil-{i}", issue_credential(served.client, f"sybil {i}")) for i in range(MAX_LEASES_PER_TASK + 1)
    ]
    [task] = add_tasks(bus, 1)
    assert len(droppers[0].lease(max_groups=1)) == 1
    for sybil in droppers[1:]:  # each takes it once the last let it expire, and lets it expire in turn
        wait_for(lambda sybil=sybil: sybil.lease(max_groups=1), "the expired task", timeout_s=10, interval_s=0.05)

    taken = wait_for(
        lambda: [t for t in proven.lease(max_groups=MAX_HELD) if t[1].task_id == task.task_id] or None,
        "the task, alive",
        timeout_s=10,
        interval_s=0.05,
    )
    answer_all(proven, taken)
    assert bus.length(DEAD) == 0
    assert all(accounting(served).workers[s.worker_id].expired == 1 for s in droppers)


def test_a_worker_still_earning_that_fails_a_task_gives_it_back(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve()
    newcomer = join("newcomer", issue_credential(served.client, "new"))
    proven = join("proven")
    earn_full_allowance(proven, bus)
    add_tasks(bus, 2)
    [(lease_id, task), _] = newcomer.lease(max_groups=2)

    failed = newcomer.http.post(FAILURES_PATH, json={"lease_id": lease_id, "error": "engine error"})
    assert failed.status_code == 204
    taken = proven.lease(max_groups=1)  # at once: it was given back as if its lease had run out

    assert taken == [(lease_id, task)]
    answer_all(proven, taken)
    assert bus.length(DEAD) == 0
    counts = accounting(served).workers[newcomer.worker_id]
    assert (counts.failed, counts.expired) == (0, 1)
    assert float(redis_client.hget(keys.work_counts(newcomer.worker_id), "allowance")) == 1  # halved


def test_a_quarantined_credential_stops_every_live_identity_it_holds(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve(work=WorkConfig(max_held_tasks=MAX_HELD, earn_leases=False))
    token = issue_credential(served.client, "operator")
    suspect, sibling = join("suspect", token), join("sibling", token)
    control = served.app.state.control
    add_tasks(bus, 4)
    bus.put_state(LEARNER_STATE, learner_state(bus.keys.run_id, {suspect.worker_id: trust(suspect=True)}))

    control.run_once()  # the suspect is quarantined and holds its credential

    assert served.client.get(f"/v1/workers/{suspect.worker_id}").json()["state"] == WorkerState.QUARANTINED.value
    assert sibling.lease(max_groups=4) == []  # at once: the lease script reads the credential's quarantine
    again = served.client.post("/v1/workers", json={"name": "fresh"}, headers={"X-RL-Join-Token": token})
    assert again.status_code == 403 and "quarantined" in again.json()["detail"]
    control.run_once()  # and the next pass quarantines its live siblings
    assert served.client.get(f"/v1/workers/{sibling.worker_id}").json()["state"] == WorkerState.QUARANTINED.value
    assert len(join("shared-token worker", JOIN_TOKEN).lease(max_groups=4)) == 4  # other credentials go on


def test_a_credential_whose_identities_together_let_leases_expire_is_quarantined(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served, join = serve(
        work=WorkConfig(max_held_tasks=4, earn_leases=False, quarantine_min_ended_leases=20),
        credentials=CredentialConfig(max_workers=10),
    )
    control = served.app.state.control
    token = issue_credential(served.client, "hit and run")
    honest = [join("honest-a"), join("honest-b")]
    for _ in range(5):  # 20 leases each answered and scored: the fleet's median completion is 1.0
        for worker in honest:
            add_tasks(bus, 4)
            answer_all(worker, worker.lease(max_groups=4))
            score_groups(redis_client, keys, worker.worker_id, 4)
    for i in range(5):  # each identity leases 4 and never answers: 4 ended leases each, too few to judge one
        add_tasks(bus, 4)
        assert len(join(f"hit-{i}", token).lease(max_groups=4)) == 4
        for worker_id, taken in take_as_they_expire(honest, 4).items():
            score_groups(redis_client, keys, worker_id, len(taken))

    operator_id = token.partition(".")[0]

    def operator() -> dict[str, Any]:
        control.run_once()
        return dict(served.client.get(f"/v1/operators/{operator_id}", headers=bearer(ADMIN_TOKEN)).json())

    info = wait_for(lambda: (found := operator())["state"] == "quarantined" and found, "the credential quarantined")
    assert "identities together" in info["quarantine_reason"]
    assert info["record"]["expired"] == 20 and accounting(served).flagged == {}  # no identity flagged alone
    refused = served.client.post("/v1/workers", json={"name": "next"}, headers={"X-RL-Join-Token": token})
    assert refused.status_code == 403
