"""Decode bombs against the work API (shared/bounded_msgpack.py, shared/rollout_limits.py, routers/work.py): a
registered worker's 16 MiB body that would decode into millions of objects, nest without end, or carry huge
strings is refused with a 422 naming the limit it broke, before it is built; a group that is such a bomb, or
holds more samples, tokens or text than its task allows, is refused alone and leaves a bounded dead letter;
the largest honest groups of a run are still accepted; and the coordinator keeps answering other requests
while bombs arrive. Real redis-server, the real app under uvicorn; the costs are measured by
benchmarks/decode_bomb.py, not here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from benchmarks.decode_bomb import array_of_empty_maps, deep_nesting, huge_run_id
from services.coordinator.work_leases import MAX_DEAD_LETTER_PAYLOAD_BYTES
from shared.bus import StreamBus
from shared.config import GRPOConfig, ModelConfig, RolloutConfig, RunConfig
from shared.keys import RunKeys
from shared.messages import RolloutGroup, TaskGroup, pack_float32, pack_int32
from shared.rollout_limits import MAX_GROUP_BYTES
from shared.streams import TASKS
from shared.work_api import MAX_SUBMISSION_BYTES, MSGPACK_CONTENT_TYPE, ROLLOUTS_PATH, max_submission_bytes
from tests.coordinator_rest import ServeCoordinator, ServedCoordinator, bearer, register
from tests.integration.test_work_api import Worker, add_tasks, answer
from tests.polling import wait_for

pytestmark = pytest.mark.integration

LEASE_MS = 60_000  # no lease runs out during a test
MSGPACK = {"Content-Type": MSGPACK_CONTENT_TYPE}
# a refused answer's dead letter: at most this much of what was sent, plus its reason (<= 4,000 characters)
MAX_LETTER_BYTES = MAX_DEAD_LETTER_PAYLOAD_BYTES + 4 * 4000 + 1024


SUBMISSION_BOMBS = {
    "one array of empty maps": (array_of_empty_maps, "an array of 16777211 entries, over the decode limit of 64"),
    "deep nesting": (deep_nesting, "nested deeper than 3"),
    "a huge string": (huge_run_id, "a string of 16777203 bytes, over the decode limit of 512"),
}


@pytest.fixture
def serve(
    serve_coordinator: ServeCoordinator, run_id: str
) -> Iterator[Callable[..., tuple[ServedCoordinator, Callable[[str], Worker]]]]:
    """serve(**run) -> the coordinator of a run with these sections, and join(name) -> a registered worker."""
    clients: list[httpx.Client] = []

    def serve_run(**sections: object) -> tuple[ServedCoordinator, Callable[[str], Worker]]:
        run = RunConfig(run_id=run_id, rollout=RolloutConfig(claim_idle_ms=LEASE_MS), **sections)
        served = serve_coordinator(run)

        def join(name: str) -> Worker:
            registration = register(served.client, name)
            http = httpx.Client(base_url=served.url, timeout=30, headers=bearer(registration.token))
            clients.append(http)
            return Worker(registration.worker_id, http, run_id)

        return served, join

    yield serve_run
    for http in clients:
        http.close()


def lease_one(worker: Worker) -> tuple[str, TaskGroup]:
    [leased] = wait_for(lambda: worker.lease(max_groups=1), "a lease", timeout_s=10, interval_s=0.05)
    return leased


def stream_lengths(redis_client: redis.Redis, keys: RunKeys) -> dict[str, int]:
    """Entries of each of the run's streams: wherever the coordinator keeps what it refuses."""
    return {
        key.decode(): redis_client.xlen(key) for key in redis_client.scan_iter(match=keys.prefix + "*", _type="stream")
    }


def stream_entries_over(redis_client: redis.Redis, keys: RunKeys, max_bytes: int) -> list[tuple[str, int]]:
    """(stream, entry size) of every entry of the run's streams over `max_bytes`."""
    found = []
    for key in stream_lengths(redis_client, keys):
        for _, fields in redis_client.xrange(key):
            size = sum(len(name) + len(value) for name, value in fields.items())
            if size > max_bytes:
                found.append((key, size))
    return found


@pytest.mark.parametrize("name", SUBMISSION_BOMBS)
def test_a_submission_bomb_gets_422_naming_its_limit_and_leaves_nothing(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys, name: str
) -> None:
    served, join = serve()
    bomber = join("bomber")
    add_tasks(bus, 1)
    lease_id, task = lease_one(bomber)
    build, reason = SUBMISSION_BOMBS[name]
    body = build(MAX_SUBMISSION_BYTES)
    assert len(body) == MAX_SUBMISSION_BYTES  # the largest body the route takes
    streams = stream_lengths(redis_client, keys)
    honest_body = [(lease_id, answer(task, bomber.worker_id).encode())]

    response = bomber.http.post(ROLLOUTS_PATH, content=body, headers=MSGPACK)
    # at once: the first penalty lasts PENALTY_BASE_S (0.5 s), which a busy machine's Redis calls could outlast
    penalised = bomber.submit_raw(honest_body)  # its next submission is refused unread for a while

    assert response.status_code == 422 and reason in response.json()["detail"], response.text[:500]
    assert penalised.status_code == 429 and int(penalised.headers["Retry-After"]) >= 1, penalised.text
    assert stream_lengths(redis_client, keys) == streams  # no dead letter: nothing of either was kept
    accepted = wait_for(lambda: (r := bomber.submit_raw(honest_body)).status_code == 200 and r, "the penalty over")
    assert accepted.json()["accepted"] == [lease_id]  # the lease is intact


def group_bombs() -> dict[str, tuple[Callable[[TaskGroup, str], bytes], str]]:
    """Group bytes that break their task's limits (add_tasks: 2 samples of at most 4 tokens), and why."""

    def encoded(**fields: object) -> Callable[[TaskGroup, str], bytes]:
        return lambda task, worker_id: answer(task, worker_id, **fields).encode()

    three_samples = dict(
        completion_token_ids=pack_int32([4, 5, 6]),
        completion_lengths=pack_int32([1, 1, 1]),
        behaviour_logprobs=pack_float32([-1.0] * 3),
        completion_texts=["a", "b", "c"],
        finish_reasons=["stop"] * 3,
    )
    long_samples = dict(
        completion_token_ids=pack_int32([4] * 10),
        completion_lengths=pack_int32([5, 5]),
        behaviour_logprobs=pack_float32([-1.0] * 10),
    )
    return {
        "an array of empty maps": (lambda *_: array_of_empty_maps(MAX_GROUP_BYTES), "over the decode limit of 2"),
        "deep nesting": (lambda *_: deep_nesting(MAX_GROUP_BYTES), "nested deeper than 2"),
        "more samples": (encoded(**three_samples), "an array of 3 entries, over the decode limit of 2"),
        "longer samples": (encoded(**long_samples), "5 model tokens, over the task's max_new_tokens (4)"),
        "a huge text": (encoded(completion_texts=["a" * (MAX_GROUP_BYTES // 2), "b"]), "a string of 2097152 bytes"),
    }


@pytest.mark.parametrize("name", group_bombs())
def test_a_group_bomb_is_refused_alone_naming_its_limit_with_a_bounded_dead_letter(
    serve, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys, name: str
) -> None:
    served, join = serve()
    bomber = join("bomber")
    add_tasks(bus, 1)
    lease_id, task = lease_one(bomber)
    build, reason = group_bombs()[name]

    response = bomber.submit_raw([(lease_id, build(task, bomber.worker_id))])

    assert response.status_code == 200, response.text[:500]
    [refusal] = response.json()["refused"]
    assert refusal["lease_id"] == lease_id and "malformed group" in refusal["reason"] and reason in refusal["reason"]
    assert stream_entries_over(redis_client, keys, MAX_LETTER_BYTES) == []
    assert bomber.submit([(lease_id, answer(task, bomber.worker_id))]).accepted == [lease_id]  # left as it was


def largest_answer(task: TaskGroup, worker_id: str) -> RolloutGroup:
    """An honest group at its task's limits: every sample max_new_tokens long, 4 bytes of text per token."""
    lengths = [task.max_new_tokens] * task.num_samples
    num_tokens = sum(lengths)
    return answer(
        task,
        worker_id,
        completion_token_ids=pack_int32([7] * num_tokens),
        completion_lengths=pack_int32(lengths),
        behaviour_logprobs=pack_float32([-1.0] * num_tokens),
        completion_texts=["\U0001d7d8" * task.max_new_tokens] * task.num_samples,
        finish_reasons=["length"] * task.num_samples,
    )


def test_the_largest_honest_groups_are_accepted(serve, bus: StreamBus) -> None:
    served, join = serve()  # a model folder: the run bounds no prompt, its body limit is 16 MiB
    worker = join("honest")
    task = TaskGroup(
        run_id=bus.keys.run_id,
        task_id="largest",
        task_name="arithmetic_mod10",
        prompt="1+2=" * 16384,  # TaskGroup's longest prompt
        num_samples=64,
        max_new_tokens=4096,
        temperature=1.0,
    )
    bus.publish(TASKS, task)
    lease_id, leased = lease_one(worker)
    group = largest_answer(leased, worker.worker_id)
    assert 3 * 1024 * 1024 < len(group.encode()) <= MAX_GROUP_BYTES

    assert worker.submit([(lease_id, group)]).accepted == [lease_id]


def test_a_tiny_random_runs_body_limit_follows_its_context(serve, bus: StreamBus) -> None:
    """The demo's run (a 32-token context): its body limit is the 1 MiB floor (tests/unit/test_rollout_limits.py:
    64 of its largest honest groups fit), a larger body is 413, and its largest honest group is accepted."""
    run = dict(model=ModelConfig(init="tiny-random", max_position_embeddings=32), grpo=GRPOConfig(max_new_tokens=2))
    served, join = serve(**run)
    worker = join("honest")
    limit = max_submission_bytes(RunConfig(run_id=bus.keys.run_id, **run))
    prompt = "1+2=" * 7  # 28 characters: with 2 new tokens and a BOS, the whole context
    bus.publish(
        TASKS,
        TaskGroup(
            run_id=bus.keys.run_id,
            task_id="demo",
            task_name="arithmetic_mod10",
            prompt=prompt,
            num_samples=8,
            max_new_tokens=2,
            temperature=1.0,
        ),
    )
    lease_id, task = lease_one(worker)

    over = worker.http.post(ROLLOUTS_PATH, content=b"\x00" * (limit + 1), headers=MSGPACK)
    accepted = worker.submit([(lease_id, largest_answer(task, worker.worker_id))]).accepted

    assert limit == 1024 * 1024 and over.status_code == 413 and accepted == [lease_id]


def test_the_coordinator_answers_status_and_leases_while_bombs_arrive(serve, bus: StreamBus) -> None:
    served, join = serve()
    bombers, honest = [join(f"bomber-{i}") for i in range(3)], join("honest")
    add_tasks(bus, 1)
    bomb = array_of_empty_maps(MAX_SUBMISSION_BYTES)
    stop = threading.Event()
    statuses: list[int] = []

    def send_bombs(bomber: Worker) -> None:
        while not stop.is_set():
            statuses.append(bomber.http.post(ROLLOUTS_PATH, content=bomb, headers=MSGPACK).status_code)

    with ThreadPoolExecutor(len(bombers)) as pool:
        sending = [pool.submit(send_bombs, bomber) for bomber in bombers]
        try:
            wait_for(lambda: len(statuses) >= len(bombers), "bombs answered", timeout_s=60, interval_s=0.05)
            answers = [served.client.get("/v1/status").status_code for _ in range(5)]  # while they keep coming
            lease_id, task = lease_one(honest)
            accepted = honest.submit([(lease_id, answer(task, honest.worker_id))]).accepted
        finally:
            stop.set()
        for future in sending:
            future.result()

    assert answers == [200] * 5 and accepted == [lease_id]
    # each bomber's first bomb is decoded and refused (422); its next ones wait out their penalty, unread (429)
    assert set(statuses) == {422, 429} and statuses.count(422) >= len(bombers)
