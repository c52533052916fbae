"""Eval tasks through the work API (services/coordinator/eval_leases.py) against a real redis-server and the real
coordinator under uvicorn, with registered workers calling it over HTTP: a version's eval tasks go only to a
worker that names that version, before its training tasks; their answers are checked like rollouts (and for the
version, one sample) and go to `eval_rollouts`; a lease given back goes to another worker at the version without
penalty; and the rollout accounting (leased = accepted + failed + expired + held) never sees any of it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from shared.bus import StreamBus
from shared.config import RolloutConfig, RunConfig, WorkConfig
from shared.messages import RolloutGroup, TaskGroup, pack_float32, pack_int32
from shared.streams import DEAD, EVAL_ROLLOUTS, ROLLOUTS, TASKS
from shared.work_api import (
    ACCOUNTING_PATH,
    FAILURES_PATH,
    LEASE_PATH,
    MSGPACK_CONTENT_TYPE,
    ROLLOUTS_PATH,
    LeaseResponse,
    SubmitResponse,
    SubmittedGroup,
    WorkAccounting,
    WorkSubmission,
)
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, ServedCoordinator, bearer, register
from tests.eval_tasks import issue_evals
from tests.polling import wait_for

pytestmark = pytest.mark.integration

LEASE_MS = 300
VERSION = 5


@pytest.fixture
def served(serve_coordinator: ServeCoordinator, run_id: str) -> ServedCoordinator:
    run = RunConfig(run_id=run_id, rollout=RolloutConfig(claim_idle_ms=LEASE_MS), work=WorkConfig(earn_leases=False))
    return serve_coordinator(run)


@dataclass(frozen=True)
class Worker:
    worker_id: str
    http: httpx.Client
    run_id: str

    def lease(self, max_groups: int = 8, version: int | None = None, max_eval: int = 8) -> list[tuple[str, TaskGroup]]:
        body = {"max_groups": max_groups, "policy_version": version, "max_eval_groups": max_eval}
        response = self.http.post(LEASE_PATH, json=body)
        assert response.status_code == 200, response.text
        return [(leased.lease_id, leased.task) for leased in LeaseResponse.model_validate_json(response.content).tasks]

    def submit(self, answers: list[tuple[str, RolloutGroup]], eval_version: int | None = VERSION) -> SubmitResponse:
        groups = [SubmittedGroup(lease_id=i, group=g.encode(), eval_version=eval_version) for i, g in answers]
        body = WorkSubmission(run_id=self.run_id, groups=groups).encode()
        response = self.http.post(ROLLOUTS_PATH, content=body, headers={"Content-Type": MSGPACK_CONTENT_TYPE})
        assert response.status_code == 200, response.text
        return SubmitResponse.model_validate_json(response.content)


@pytest.fixture
def join(served: ServedCoordinator, run_id: str) -> Iterator[Callable[[str], Worker]]:
    clients: list[httpx.Client] = []

    def join(name: str) -> Worker:
        registration = register(served.client, name)
        http = httpx.Client(base_url=served.url, timeout=10, headers=bearer(registration.token))
        clients.append(http)
        return Worker(registration.worker_id, http, run_id)

    yield join
    for http in clients:
        http.close()


def add_tasks(bus: StreamBus, num_tasks: int) -> None:
    for i in range(num_tasks):
        task = TaskGroup(
            run_id=bus.keys.run_id,
            task_id=uuid.uuid4().hex,
            task_name="arithmetic_mod10",
            prompt=f"{i}+1=",
            num_samples=2,
            max_new_tokens=2,
            temperature=1.0,
        )
        bus.publish(TASKS, task)


def answer(task: TaskGroup, worker_id: str, num_samples: int = 1, **fields: object) -> RolloutGroup:
    return RolloutGroup(
        run_id=task.run_id,
        group_id=uuid.uuid4().hex,
        task_id=task.task_id,
        task_name=task.task_name,
        prompt=task.prompt,
        worker_id=worker_id,
        policy_version=task.eval_version if task.eval_version is not None else 0,
        temperature=task.temperature,
        prompt_token_ids=pack_int32([1, 2]),
        completion_token_ids=pack_int32([4, 5] * num_samples),
        completion_lengths=pack_int32([2] * num_samples),
        behaviour_logprobs=pack_float32([-1.0, -1.0] * num_samples),
        completion_texts=["7"] * num_samples,
        finish_reasons=["stop"] * num_samples,
        generation_s=0.01,
    ).model_copy(update=fields)


def accounting(served: ServedCoordinator) -> WorkAccounting:
    response = served.client.get(ACCOUNTING_PATH, headers=bearer(ADMIN_TOKEN))
    assert response.status_code == 200, response.text
    return WorkAccounting.model_validate_json(response.content)


def test_eval_tasks_go_only_to_a_worker_at_that_version_and_before_its_training_tasks(
    served: ServedCoordinator, join: Callable[[str], Worker], bus: StreamBus
) -> None:
    evals = issue_evals(bus, VERSION, [f"{i}+2=" for i in range(3)])
    add_tasks(bus, 7)
    behind, unversioned, current = join("behind"), join("unversioned"), join("current")

    assert all(task.eval_version is None for _, task in behind.lease(max_groups=2, version=VERSION - 1))
    assert all(task.eval_version is None for _, task in unversioned.lease(max_groups=2))
    leased = current.lease(max_groups=2, version=VERSION, max_eval=2)
    assert [task.eval_version for _, task in leased] == [VERSION, VERSION, None, None]
    assert [task.task_id for _, task in leased[:2]] == [task.task_id for task in evals[:2]]
    (_, last), *rest = current.lease(max_groups=1, version=VERSION, max_eval=8)  # the third eval task, then training
    assert last.task_id == evals[2].task_id and [task.eval_version for _, task in rest] == [None]
    first_leased_at_s = bus.redis.hget(bus.keys.eval_state(VERSION), "first_leased_at_s")
    assert first_leased_at_s is not None and float(first_leased_at_s) > 0

    books = accounting(served)
    assert books.totals.leased == 7 and books.eval_totals.leased == 3
    assert books.eval_workers[current.worker_id].leased == 3 and behind.worker_id not in books.eval_workers


def test_eval_answers_are_checked_like_rollouts_and_for_their_version_and_counted_apart(
    served: ServedCoordinator, join: Callable[[str], Worker], bus: StreamBus
) -> None:
    issue_evals(bus, VERSION, [f"{i}+2=" for i in range(4)])
    worker, other = join("worker"), join("other")
    (id_a, a), (id_b, b), (id_c, c) = worker.lease(version=VERSION, max_eval=3)
    ((id_d, d),) = other.lease(version=VERSION, max_eval=1)

    right = answer(c, worker.worker_id)
    reply = worker.submit(
        [
            (id_a, answer(a, worker.worker_id, policy_version=VERSION - 1)),  # another version's weights
            (id_b, answer(b, worker.worker_id, num_samples=2)),  # two samples
            (id_d, answer(d, worker.worker_id)),  # a lease it does not hold
            (id_c, right),
        ]
    )
    assert reply.accepted == [id_c]
    reasons = {refusal.lease_id: refusal.reason for refusal in reply.refused}
    assert f"an eval task of version {VERSION} answered with version {VERSION - 1}" in reasons[id_a]
    assert "over the decode limit of 1" in reasons[id_b]  # the task's limits: one sample
    assert "not held" in reasons[id_d]
    assert worker.submit([(id_c, right)]).accepted == [id_c]  # the same bytes again (a lost reply): accepted once
    (accepted,) = bus.entries(EVAL_ROLLOUTS)
    assert accepted.task_id == c.task_id and accepted.policy_version == VERSION
    assert bus.length(ROLLOUTS) == 0 and bus.entries(DEAD) == []
    assert worker.submit([(id_a, answer(a, worker.worker_id))], eval_version=None).refused  # not a training lease

    books = accounting(served)
    assert books.eval_workers[worker.worker_id].accepted == 1
    assert books.eval_workers[worker.worker_id].refused >= 3
    assert books.totals.leased == books.totals.accepted == books.totals.failed == books.totals.expired == 0
    for counts in books.workers.values():
        assert counts.num_unaccounted == 0


def test_an_eval_lease_given_back_or_left_goes_to_another_worker_at_the_version_without_penalty(
    served: ServedCoordinator, join: Callable[[str], Worker], bus: StreamBus
) -> None:
    issue_evals(bus, VERSION, [f"{i}+2=" for i in range(2)])
    moved, left, taker = join("moved"), join("left"), join("taker")
    ((given_id, _),) = moved.lease(version=VERSION, max_eval=1)
    ((left_id, _),) = left.lease(version=VERSION, max_eval=1)

    response = moved.http.post(
        FAILURES_PATH, json={"lease_id": given_id, "error": "my version moved on", "eval_version": VERSION}
    )
    assert response.status_code == 204, response.text
    assert [i for i, _ in taker.lease(version=VERSION, max_eval=8)] == [given_id]  # at once: given back
    taken = wait_for(lambda: taker.lease(version=VERSION, max_eval=8), "the left lease past its lease time")
    assert [i for i, _ in taken] == [left_id]
    again = moved.http.post(FAILURES_PATH, json={"lease_id": given_id, "error": "x", "eval_version": VERSION})
    assert again.status_code == 409

    books = accounting(served)
    assert books.eval_workers[moved.worker_id].given_back == 1 and books.eval_workers[moved.worker_id].expired == 0
    assert books.eval_workers[left.worker_id].expired == 1
    assert books.totals.failed == 0 and books.totals.expired == 0 and bus.entries(DEAD) == []
