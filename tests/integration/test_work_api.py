"""The work API (shared/work_api.py, services/coordinator/work_leases.py) against a real redis-server and the
real coordinator under uvicorn, with registered workers calling it over HTTP as a hostile or honest worker
would: tasks go only to active workers, a lease is answered at most once and only by its holder, a lease
not answered in time goes to another worker (counted `expired` against the first), failures are
dead-lettered, bad bodies get 4xx, and the counters close: leased = accepted + failed + expired + held."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
import redis

from services.coordinator.work_leases import MAX_REFUSAL_PAYLOAD_BYTES, refusal_letters
from shared.api import WorkerState
from shared.bus import StreamBus
from shared.config import RolloutConfig, RunConfig, WorkConfig
from shared.messages import DeadLetter, RolloutGroup, TaskGroup, pack_float32, pack_int32
from shared.streams import DEAD, ROLLOUTS, TASKS
from shared.work_api import (
    ACCOUNTING_PATH,
    FAILURES_PATH,
    LEASE_PATH,
    MAX_SUBMISSION_BYTES,
    MSGPACK_CONTENT_TYPE,
    ROLLOUTS_PATH,
    LeaseResponse,
    SubmitResponse,
    SubmittedGroup,
    WorkAccounting,
    WorkSubmission,
)
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, ServedCoordinator, bearer, register, score_groups
from tests.manual_clock import ManualClock
from tests.polling import wait_for

pytestmark = pytest.mark.integration

LEASE_MS = 300  # the run file's rollout.claim_idle_ms: a task unanswered this long goes to another worker
TRUSTED_NEWCOMERS = WorkConfig(earn_leases=False)  # every identity holds max_held_tasks from its start


@pytest.fixture
def served(serve_coordinator: ServeCoordinator, run_id: str, clock: ManualClock) -> ServedCoordinator:
    """A run whose new identities hold what they ask for at once: earning leases is tested in test_lease_allowance.py."""
    run = RunConfig(run_id=run_id, rollout=RolloutConfig(claim_idle_ms=LEASE_MS), work=TRUSTED_NEWCOMERS)
    return serve_coordinator(run, lease_clock=clock)


@dataclass(frozen=True)
class Worker:
    """A registered worker calling the work API with its own token."""

    worker_id: str
    http: httpx.Client
    run_id: str

    def lease(self, max_groups: int = 8) -> list[tuple[str, TaskGroup]]:
        response = self.http.post(LEASE_PATH, json={"max_groups": max_groups})
        assert response.status_code == 200, response.text
        return [(leased.lease_id, leased.task) for leased in LeaseResponse.model_validate_json(response.content).tasks]

    def submit_raw(self, answers: list[tuple[str, bytes]]) -> httpx.Response:
        groups = [SubmittedGroup(lease_id=lease_id, group=group) for lease_id, group in answers]
        body = WorkSubmission(run_id=self.run_id, groups=groups).encode()
        return self.http.post(ROLLOUTS_PATH, content=body, headers={"Content-Type": MSGPACK_CONTENT_TYPE})

    def submit(self, answers: list[tuple[str, RolloutGroup]]) -> SubmitResponse:
        response = self.submit_raw([(lease_id, group.encode()) for lease_id, group in answers])
        assert response.status_code == 200, response.text
        return SubmitResponse.model_validate_json(response.content)


@pytest.fixture
def join(served: ServedCoordinator, run_id: str) -> Iterator[Callable[[str], Worker]]:
    """join(name) -> a registered worker with its own HTTP client (closed at the end)."""
    clients: list[httpx.Client] = []

    def join(name: str) -> Worker:
        registration = register(served.client, name)
        http = httpx.Client(base_url=served.url, timeout=10, headers=bearer(registration.token))
        clients.append(http)
        return Worker(registration.worker_id, http, run_id)

    yield join
    for http in clients:
        http.close()


def refusals(bus: StreamBus, credential_id: str = "") -> list[DeadLetter]:
    """The dead letters of refused answers of a credential's identities (the shared token's by default)."""
    return refusal_letters(bus.redis, bus.keys, credential_id)


def add_tasks(bus: StreamBus, num_tasks: int) -> list[TaskGroup]:
    """What the reward service does: TaskGroups on the `tasks` stream."""
    tasks = [
        TaskGroup(
            run_id=bus.keys.run_id,
            task_id=uuid.uuid4().hex,
            task_name="arithmetic_mod10",
            prompt=f"{i}+1=",
            num_samples=2,
            max_new_tokens=4,
            temperature=1.0,
        )
        for i in range(num_tasks)
    ]
    for task in tasks:
        bus.publish(TASKS, task)
    return tasks


def answer(task: TaskGroup, worker_id: str, **fields: object) -> RolloutGroup:
    """A well-formed group for `task` (two samples of two tokens each)."""
    return RolloutGroup(
        run_id=task.run_id,
        group_id=uuid.uuid4().hex,
        task_id=task.task_id,
        task_name=task.task_name,
        prompt=task.prompt,
        worker_id=worker_id,
        policy_version=0,
        temperature=task.temperature,
        prompt_token_ids=pack_int32([1, 2, 3]),
        completion_token_ids=pack_int32([4, 5, 6, 7]),
        completion_lengths=pack_int32([2, 2]),
        behaviour_logprobs=pack_float32([-1.0] * 4),
        completion_texts=["a", "b"],
        finish_reasons=["stop", "stop"],
        generation_s=0.01,
    ).model_copy(update=fields)


def accounting(served: ServedCoordinator) -> WorkAccounting:
    response = served.client.get(ACCOUNTING_PATH, headers=bearer(ADMIN_TOKEN))
    assert response.status_code == 200, response.text
    return WorkAccounting.model_validate_json(response.content)


def assert_counters_close(served: ServedCoordinator) -> WorkAccounting:
    counts = accounting(served)
    for worker_id, worker in counts.workers.items():
        assert worker.num_unaccounted == 0, (worker_id, worker)
    assert counts.totals.num_unaccounted == 0, counts.totals
    for name in ("leased", "returned", "accepted", "refused", "expired", "failed", "held"):
        assert getattr(counts.totals, name) == sum(getattr(w, name) for w in counts.workers.values()), name
    return counts


def test_a_correct_answer_lands_on_rollouts_once_and_acks_its_task(served, join, bus: StreamBus) -> None:
    worker = join("honest")
    tasks = add_tasks(bus, 3)

    leased = worker.lease(max_groups=8)
    answered = worker.submit([(lease_id, answer(task, worker.worker_id)) for lease_id, task in leased])

    assert [task.task_id for _, task in leased] == [task.task_id for task in tasks]
    assert answered.accepted == [lease_id for lease_id, _ in leased] and answered.refused == []
    assert [group.task_id for group in bus.entries(ROLLOUTS)] == [task.task_id for task in tasks]
    assert bus.group_progress(TASKS) == (0, 0)  # every task delivered and acked
    counts = assert_counters_close(served).workers[worker.worker_id]
    assert (counts.leased, counts.returned, counts.accepted, counts.held) == (3, 3, 3, 0)


def test_a_second_answer_to_the_same_lease_is_refused_and_dead_lettered(served, join, bus: StreamBus) -> None:
    worker = join("replayer")
    add_tasks(bus, 1)
    [(lease_id, task)] = worker.lease()

    first = worker.submit([(lease_id, answer(task, worker.worker_id))])
    second = worker.submit([(lease_id, answer(task, worker.worker_id))])

    assert first.accepted == [lease_id]
    assert second.accepted == [] and [r.lease_id for r in second.refused] == [lease_id]
    assert "not held" in second.refused[0].reason
    assert bus.length(ROLLOUTS) == 1
    [letter] = refusals(bus)  # in the credential's own refusals, never in `dead`
    assert letter.source_message_id == lease_id and "not held" in letter.error
    sent = answer(task, worker.worker_id).encode()
    assert len(letter.payload) <= MAX_REFUSAL_PAYLOAD_BYTES and f"{len(sent)} bytes, sha256" in letter.error
    assert bus.length(DEAD) == 0
    counts = assert_counters_close(served).workers[worker.worker_id]
    assert (counts.accepted, counts.refused) == (1, 1)


def test_the_same_answer_sent_again_is_accepted_once_without_a_dead_letter(served, join, bus: StreamBus) -> None:
    worker = join("retrier")
    add_tasks(bus, 1)
    [(lease_id, task)] = worker.lease()
    group = answer(task, worker.worker_id)

    first = worker.submit([(lease_id, group)])
    retry = worker.submit([(lease_id, group)])  # its first reply was lost: the same bytes again
    other = worker.submit([(lease_id, answer(task, worker.worker_id))])  # a second, different answer

    assert first.accepted == [lease_id] and retry.accepted == [lease_id] and retry.refused == []
    assert other.accepted == [] and "not held" in other.refused[0].reason
    assert (
        bus.length(ROLLOUTS) == 1 and len(refusals(bus)) == 1 and bus.length(DEAD) == 0
    )  # the different answer's letter only
    counts = assert_counters_close(served).workers[worker.worker_id]
    assert (counts.accepted, counts.refused) == (1, 1)


def test_concurrent_answers_to_one_lease_are_accepted_once(served, join, bus: StreamBus) -> None:
    worker = join("racer")
    add_tasks(bus, 1)
    [(lease_id, task)] = worker.lease()

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: worker.submit([(lease_id, answer(task, worker.worker_id))]), range(8)))

    assert sum(len(a.accepted) for a in answers) == 1 and sum(len(a.refused) for a in answers) == 7
    assert bus.length(ROLLOUTS) == 1 and len(refusals(bus)) == 7 and bus.length(DEAD) == 0
    assert_counters_close(served)


def test_answering_another_workers_lease_is_refused(served, join, bus: StreamBus) -> None:
    holder, thief = join("holder"), join("thief")
    add_tasks(bus, 1)
    [(lease_id, task)] = holder.lease()

    stolen = thief.submit([(lease_id, answer(task, thief.worker_id))])
    forged = thief.submit([(lease_id, answer(task, holder.worker_id))])  # and claiming to be the holder

    assert stolen.accepted == [] and forged.accepted == []
    assert bus.length(ROLLOUTS) == 0 and len(refusals(bus)) == 2 and bus.length(DEAD) == 0
    assert bus.group_progress(TASKS) == (0, 1)  # still the holder's, untouched
    assert holder.submit([(lease_id, answer(task, holder.worker_id))]).accepted == [lease_id]
    counts = assert_counters_close(served).workers
    assert counts[thief.worker_id].refused == 2 and counts[thief.worker_id].returned == 0


def test_a_group_for_another_task_or_worker_or_malformed_is_refused_and_leaves_the_lease(
    served, join, bus: StreamBus
) -> None:
    worker, other = join("liar"), join("other")
    add_tasks(bus, 1)
    [(lease_id, task)] = worker.lease()

    wrong_task = worker.submit([(lease_id, answer(task, worker.worker_id, task_id="another-task"))])
    wrong_worker = worker.submit([(lease_id, answer(task, other.worker_id))])
    malformed = worker.submit_raw([(lease_id, b"\x93not a group")])
    honest = worker.submit([(lease_id, answer(task, worker.worker_id))])

    assert "another-task" in wrong_task.refused[0].reason
    assert "claims worker" in wrong_worker.refused[0].reason
    assert malformed.status_code == 200 and "malformed" in malformed.json()["refused"][0]["reason"]
    assert honest.accepted == [lease_id]  # the refusals left the lease as it was
    assert bus.length(ROLLOUTS) == 1 and len(refusals(bus)) == 3 and bus.length(DEAD) == 0
    counts = assert_counters_close(served).workers[worker.worker_id]
    assert (counts.returned, counts.refused, counts.accepted) == (4, 3, 1)


def test_only_active_workers_get_tasks(served, join, bus: StreamBus, clock: ManualClock) -> None:
    active, standby, draining, quarantined, dead = (join(name) for name in ("a", "s", "d", "q", "x"))
    registry = served.app.state.coordinator.registry
    add_tasks(bus, 4)
    # no control pass until the checks are done: activation would make the standby worker active again
    with served.app.state.control._lock:
        registry.set_states({standby.worker_id: (WorkerState.STANDBY, (WorkerState.ACTIVE,))})
        registry.set_states({quarantined.worker_id: (WorkerState.QUARANTINED, (WorkerState.ACTIVE,))})
        assert draining.http.post(f"/v1/workers/{draining.worker_id}/drain").status_code == 200
        registry.redis.zadd(registry.keys.worker_leases, {dead.worker_id: clock() - 1})  # its lease ran out

        assert standby.lease() == [] and draining.lease() == [] and quarantined.lease() == []
        assert dead.http.post(LEASE_PATH, json={"max_groups": 4}).status_code == 410
        assert len(active.lease(max_groups=4)) == 4
    admin = served.client.post(LEASE_PATH, json={"max_groups": 1}, headers=bearer(ADMIN_TOKEN))
    assert admin.status_code == 403  # the admin is no worker
    assert served.client.post(LEASE_PATH, json={"max_groups": 1}).status_code == 401


def test_a_lease_goes_to_another_worker_only_after_the_lease_time(served, join, bus: StreamBus) -> None:
    slow, fast = join("slow"), join("fast")
    add_tasks(bus, 1)
    [(lease_id, task)] = slow.lease()
    leased_at_s = time.monotonic()

    assert fast.lease() == []  # not expired yet: nobody else can take it
    reissued = wait_for(fast.lease, "the expired lease to be reissued", timeout_s=10, interval_s=0.05)

    assert time.monotonic() - leased_at_s >= LEASE_MS / 1000
    assert reissued == [(lease_id, task)]
    late = slow.submit([(lease_id, answer(task, slow.worker_id))])
    assert late.accepted == [] and "not held" in late.refused[0].reason  # too late: it is fast's now
    assert fast.submit([(lease_id, answer(task, fast.worker_id))]).accepted == [lease_id]
    counts = assert_counters_close(served).workers
    assert (counts[slow.worker_id].leased, counts[slow.worker_id].expired) == (1, 1)
    assert (counts[fast.worker_id].leased, counts[fast.worker_id].accepted) == (1, 1)


def test_a_failure_dead_letters_and_acks_the_task(served, join, bus: StreamBus) -> None:
    worker, other = join("failing"), join("other")
    add_tasks(bus, 2)
    [(first, task), (second, _)] = worker.lease()

    failed = worker.http.post(FAILURES_PATH, json={"lease_id": first, "error": "EngineError: prompt out of vocab"})
    not_held = other.http.post(FAILURES_PATH, json={"lease_id": second, "error": "not mine"})
    admin = served.client.post(FAILURES_PATH, json={"lease_id": second, "error": "x"}, headers=bearer(ADMIN_TOKEN))

    assert failed.status_code == 204 and not_held.status_code == 409 and admin.status_code == 403
    [letter] = bus.dead_letters()
    assert "prompt out of vocab" in letter.error and TaskGroup.decode(letter.payload).task_id == task.task_id
    assert bus.group_progress(TASKS) == (0, 1)  # the second is still the worker's
    counts = assert_counters_close(served).workers
    assert (counts[worker.worker_id].failed, counts[worker.worker_id].held) == (1, 1)


def test_bad_bodies_get_4xx_never_500(served, join, bus: StreamBus) -> None:
    worker = join("fuzzer")
    add_tasks(bus, 1)
    [(lease_id, task)] = worker.lease()
    msgpack = {"Content-Type": MSGPACK_CONTENT_TYPE}

    # a worker of its own for each bad body: after a garbage body (422) its sender's next ones get 429, unread
    bad = [join(f"fuzzer-{i}") for i in range(5)]
    senders = iter(bad)
    cases = {
        "undecodable": next(senders).http.post(ROLLOUTS_PATH, content=b"\xc1garbage", headers=msgpack),
        "empty": next(senders).http.post(ROLLOUTS_PATH, content=b"", headers=msgpack),
        "json": next(senders).http.post(ROLLOUTS_PATH, json={"groups": []}),
        "oversized": next(senders).http.post(
            ROLLOUTS_PATH, content=b"\x00" * (MAX_SUBMISSION_BYTES + 1), headers=msgpack
        ),
        "other run": next(senders).http.post(
            ROLLOUTS_PATH,
            content=WorkSubmission(
                run_id="another-run", groups=[SubmittedGroup(lease_id=lease_id, group=b"x")]
            ).encode(),
            headers=msgpack,
        ),
        "lease id": worker.http.post(FAILURES_PATH, json={"lease_id": "99999999999999999999-1", "error": "x"}),
        "not an id": worker.http.post(FAILURES_PATH, json={"lease_id": "$", "error": "x"}),
        "too many": worker.http.post(LEASE_PATH, json={"max_groups": 65}),
        "none": worker.http.post(LEASE_PATH, json={"max_groups": 0}),
    }

    statuses = {name: response.status_code for name, response in cases.items()}
    assert statuses == {
        "undecodable": 422,
        "empty": 422,
        "json": 415,
        "oversized": 413,
        "other run": 422,
        "lease id": 422,
        "not an id": 422,
        "too many": 422,
        "none": 422,
    }
    assert bus.length(ROLLOUTS) == 0 and bus.group_progress(TASKS) == (0, 1)  # nothing reached the streams
    again = bad[0].http.post(ROLLOUTS_PATH, content=b"\xc1garbage", headers=msgpack)
    assert again.status_code == 429 and "Retry-After" in again.headers  # refused unread: a penalty, not a decode
    assert worker.submit([(lease_id, answer(task, worker.worker_id))]).accepted == [lease_id]


def test_the_accounting_is_for_the_admin_and_adds_up(served, join, bus: StreamBus) -> None:
    first, second = join("first"), join("second")
    add_tasks(bus, 6)
    leased = first.lease(max_groups=3)
    second.lease(max_groups=2)
    first.submit([(lease_id, answer(task, first.worker_id)) for lease_id, task in leased[:2]])
    first.http.post(FAILURES_PATH, json={"lease_id": leased[2][0], "error": "engine"})

    assert first.http.get(ACCOUNTING_PATH).status_code == 403
    counts = assert_counters_close(served)
    assert (counts.totals.leased, counts.totals.accepted, counts.totals.failed, counts.totals.held) == (5, 2, 1, 2)
    assert counts.lease_s == LEASE_MS / 1000


def test_workers_show_the_groups_accepted_not_what_their_heartbeats_claim(served, join, bus: StreamBus) -> None:
    worker = join("boaster")
    add_tasks(bus, 2)
    leased = worker.lease()
    worker.submit([(lease_id, answer(task, worker.worker_id)) for lease_id, task in leased[:1]])
    claimed = {"policy_version": 0, "num_groups_done": 26_820, "num_samples_done": 214_560}
    beat = worker.http.post(f"/v1/workers/{worker.worker_id}/heartbeat", json=claimed)
    assert beat.status_code == 200, beat.text

    [shown] = [w for w in served.client.get("/v1/workers").json() if w["worker_id"] == worker.worker_id]

    assert (shown["num_groups_done"], shown["num_samples_done"]) == (1, 2)  # one group of two samples accepted


def test_a_worker_that_leases_and_never_answers_is_flagged_against_the_fleet(
    served, join, bus: StreamBus, redis_client: redis.Redis
) -> None:
    """The honest workers' answers are scored by the reward service (recorded here as it would): an answer counts
    as completed only once it is."""
    dropper, honest_a, honest_b = join("dropper"), join("honest-a"), join("honest-b")
    held: list[tuple[str, TaskGroup]] = []
    reissued: list[tuple[str, TaskGroup]] = []
    for _ in range(2):  # two rounds of 12: it may hold at most [work] max_held_tasks (16) at once
        add_tasks(bus, 12)
        held += dropper.lease(max_groups=12)  # takes every task, answers none
        for worker in (honest_a, honest_b):  # the leases run out and go to the honest workers, who answer them
            taken = wait_for(lambda worker=worker: worker.lease(max_groups=6), "expired leases", timeout_s=10)
            while len(taken) < 6:
                taken += worker.lease(max_groups=6 - len(taken))
            assert worker.submit([(lease_id, answer(task, worker.worker_id)) for lease_id, task in taken]).refused == []
            score_groups(redis_client, bus.keys, worker.worker_id, len(taken))
            reissued += taken
    assert len(held) == 24
    add_tasks(bus, 16)
    for worker in (honest_a, honest_b):
        fresh = worker.lease(max_groups=8)
        worker.submit([(lease_id, answer(task, worker.worker_id)) for lease_id, task in fresh])
        score_groups(redis_client, bus.keys, worker.worker_id, len(fresh))

    counts = assert_counters_close(served)

    assert sorted(lease_id for lease_id, _ in reissued) == sorted(lease_id for lease_id, _ in held)
    assert counts.workers[dropper.worker_id].expired == 24 and counts.workers[dropper.worker_id].accepted == 0
    assert set(counts.flagged) == {dropper.worker_id}, counts.flagged


def test_an_answer_before_any_lease_of_the_run_is_refused_not_a_server_error(served, join, bus: StreamBus) -> None:
    early = join("early")  # no task was ever leased: the consumer group of `tasks` does not exist yet
    [task] = add_tasks(bus, 1)

    response = early.submit_raw([("1-0", answer(task, early.worker_id).encode())])

    assert response.status_code == 200, response.text
    assert [refusal["lease_id"] for refusal in response.json()["refused"]] == ["1-0"]
    assert len(early.lease(max_groups=1)) == 1  # and leasing goes on as usual
