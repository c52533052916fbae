"""How workers learn of new weights without Redis credentials: the coordinator's long poll
GET /v1/weights/latest (services/coordinator/weights_feed.py), served by a real uvicorn against a real
redis-server, and the two announcement sources a WeightsSync reads (services/rollout/announcement_client.py):
over that endpoint, and over the WEIGHTS stream itself."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from cluster.ports import free_port
from services.coordinator.weights_feed import WeightsFeed
from services.rollout.announcement_client import (
    AnnouncementSource,
    HttpAnnouncements,
    StreamAnnouncements,
    TokenRefusedError,
)
from services.rollout.coordinator_client import CoordinatorUnavailableError
from shared.api import WEIGHTS_LATEST_PATH
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.streams import WEIGHTS
from tests.coordinator_rest import (
    ADMIN_TOKEN,
    ServeCoordinator,
    ServedCoordinator,
    bearer,
    register,
    served_coordinator,
)
from tests.polling import wait_for

pytestmark = pytest.mark.integration

MAX_WAKE_S = 0.5  # a waiter answers this soon after the learner's XADD (the old path: an XREAD wake-up)


def announcement(run_id: str, policy_version: int, manifest: str = "a") -> WeightsPublished:
    return WeightsPublished(
        run_id=run_id,
        policy_version=policy_version,
        manifest_url=f"http://learner:8100/v1/weights/{policy_version}/manifest",
        manifest_sha256=manifest * 64,
        total_size_bytes=10,
        num_chunks=1,
        published_at_s=time.time(),
    )


def publish(bus: StreamBus, policy_version: int, manifest: str = "a") -> WeightsPublished:
    """What the learner does when a version is out."""
    message = announcement(bus.keys.run_id, policy_version, manifest)
    bus.publish(WEIGHTS, message)
    return message


@pytest.fixture
def coordinator(serve_coordinator: ServeCoordinator, keys: RunKeys) -> ServedCoordinator:
    return serve_coordinator(RunConfig(run_id=keys.run_id))


@pytest.fixture
def feed(coordinator: ServedCoordinator) -> WeightsFeed:
    return coordinator.app.state.weights_feed


@pytest.fixture
def token(coordinator: ServedCoordinator) -> str:
    return register(coordinator.client).token


@pytest.fixture
def api(coordinator: ServedCoordinator, token: str) -> Iterator[httpx.Client]:
    """A registered worker's client of the endpoint."""
    with httpx.Client(base_url=coordinator.url, timeout=20, headers=bearer(token)) as client:
        yield client


def latest(api: httpx.Client, **params: str | int | float) -> httpx.Response:
    return api.get(WEIGHTS_LATEST_PATH, params=params)


# the endpoint
def test_nothing_new_within_the_wait_is_a_204_after_the_wait(api: httpx.Client, bus: StreamBus) -> None:
    started_s = time.perf_counter()
    assert latest(api, wait_s=0.3).status_code == 204  # nothing announced yet
    assert time.perf_counter() - started_s >= 0.3

    publish(bus, 3)
    started_s = time.perf_counter()
    assert latest(api, after_version=3, wait_s=0.3).status_code == 204
    assert 0.3 <= time.perf_counter() - started_s < 0.3 + MAX_WAKE_S


def test_a_newer_version_already_announced_is_answered_at_once(
    api: httpx.Client, bus: StreamBus, feed: WeightsFeed
) -> None:
    publish(bus, 2)
    newest = publish(bus, 3)
    wait_for(lambda: latest(api).status_code == 200, "the feed to read the stream")

    started_s = time.perf_counter()
    response = latest(api, after_version=2, wait_s=10)
    assert time.perf_counter() - started_s < MAX_WAKE_S
    assert response.status_code == 200
    assert WeightsPublished.model_validate_json(response.content) == newest  # every field, floats exact
    assert latest(api, after_version=3).status_code == 204


def test_a_waiter_is_woken_within_milliseconds_of_the_announcement(
    api: httpx.Client, bus: StreamBus, feed: WeightsFeed
) -> None:
    publish(bus, 1)
    wait_for(lambda: latest(api).status_code == 200, "the feed to read the stream")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: (latest(api, after_version=1, wait_s=10), time.perf_counter()))
        wait_for(lambda: feed.num_waiting == 1, "the long poll to wait")
        announced_s = time.perf_counter()
        newest = publish(bus, 2)
        response, answered_s = waiting.result(timeout=10)
    assert response.status_code == 200
    assert WeightsPublished.model_validate_json(response.content) == newest
    assert answered_s - announced_s < MAX_WAKE_S


def test_two_hundred_waiting_workers_are_all_woken_by_one_announcement_without_a_thread_each(
    coordinator: ServedCoordinator, token: str, bus: StreamBus, feed: WeightsFeed
) -> None:
    num_waiters = 200
    publish(bus, 1)

    async def wait_all() -> tuple[list[httpx.Response], float, int]:
        # a client each, as 200 workers have (one shared pool of 200 connections costs httpx itself ~2 s
        # here); one TLS context for all, or building 200 of them takes half a minute
        tls = ssl.create_default_context()
        clients = [
            httpx.AsyncClient(base_url=coordinator.url, timeout=30, headers=bearer(token), verify=tls)
            for _ in range(num_waiters)
        ]
        try:
            params = {"after_version": 1, "wait_s": 10}
            waiters = [asyncio.create_task(client.get(WEIGHTS_LATEST_PATH, params=params)) for client in clients]
            deadline_s = time.monotonic() + 20
            while feed.num_waiting < num_waiters:  # polling, on the loop the clients run on
                assert time.monotonic() < deadline_s, f"only {feed.num_waiting} long polls waiting"
                await asyncio.sleep(0.01)
            num_threads = threading.active_count()
            announced_s = time.perf_counter()
            publish(bus, 2)
            responses = await asyncio.gather(*waiters)
            return responses, time.perf_counter() - announced_s, num_threads
        finally:
            for client in clients:
                await client.aclose()

    responses, all_answered_s, num_threads = asyncio.run(wait_all())
    assert [response.status_code for response in responses] == [200] * num_waiters
    assert {WeightsPublished.model_validate_json(response.content).policy_version for response in responses} == {2}
    assert all_answered_s < 2.0, all_answered_s  # ~0.3 s measured on a busy 2-core machine, clients included
    assert num_threads < 100  # this process serves them all (and runs the clients): no thread per waiter


def test_a_stopping_coordinator_answers_its_open_long_polls_instead_of_cutting_them(
    redis_client: redis.Redis, keys: RunKeys
) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool, contextlib.ExitStack() as clients:
        with served_coordinator(RunConfig(run_id=keys.run_id), redis_client) as coordinator:
            feed: WeightsFeed = coordinator.app.state.weights_feed
            token = register(coordinator.client).token
            # a client that outlives the server, as a worker's does
            api = clients.enter_context(httpx.Client(base_url=coordinator.url, timeout=20, headers=bearer(token)))
            polls = [pool.submit(latest, api, wait_s=10) for _ in range(2)]
            wait_for(lambda: feed.num_waiting == 2, "both long polls to wait")
        # the server has stopped; uvicorn alone would have cut both polls after its 1 s graceful timeout
        assert [poll.result().status_code for poll in polls] == [204, 204]


def test_a_call_without_a_valid_token_is_refused(coordinator: ServedCoordinator, bus: StreamBus) -> None:
    publish(bus, 1)
    with httpx.Client(base_url=coordinator.url, timeout=10) as client:
        assert client.get(WEIGHTS_LATEST_PATH).status_code == 401
        assert client.get(WEIGHTS_LATEST_PATH, headers=bearer("w-0123456789abcdef.forged")).status_code == 401
        admin = client.get(WEIGHTS_LATEST_PATH, headers=bearer(ADMIN_TOKEN), params={"wait_s": 5})
        assert admin.status_code == 200 and admin.json()["policy_version"] == 1


@pytest.mark.parametrize(
    "params",
    [
        {"after_version": "9" * 5000},
        {"after_version": -2},
        {"wait_s": 10.5},
        {"wait_s": "nan"},
        {"wait_s": "inf"},
        {"wait_s": -1},
        {"after_sha256": "not-a-digest"},
    ],
)
def test_absurd_parameters_are_a_422(api: httpx.Client, params: dict[str, str | int | float]) -> None:
    assert latest(api, **params).status_code == 422


def test_garbage_and_other_runs_entries_on_the_stream_are_skipped(
    api: httpx.Client, bus: StreamBus, redis_client: redis.Redis, feed: WeightsFeed
) -> None:
    valid = publish(bus, 1)
    bus.publish_raw(WEIGHTS, b"\xc1 not msgpack")
    wait_for(lambda: feed.num_skipped == 1, "the garbage entry skipped")
    response = latest(api, wait_s=5)
    assert response.status_code == 200
    assert WeightsPublished.model_validate_json(response.content) == valid  # garbage on top hides nothing

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(latest, api, after_version=1, wait_s=10)
        wait_for(lambda: feed.num_waiting == 1, "the long poll to wait")
        redis_client.xadd(bus.keys.name_of(WEIGHTS), {"unrelated": "field"})
        bus.publish(WEIGHTS, announcement("another-run", 7))
        wait_for(lambda: feed.num_skipped == 3, "the entries skipped")
        assert feed.num_waiting == 1 and not waiting.done()  # nothing of it answered the waiter
        newest = publish(bus, 2)
        response = waiting.result(timeout=10)
    assert response.status_code == 200
    assert WeightsPublished.model_validate_json(response.content) == newest


def test_a_resumed_learner_announcing_a_lower_version_is_news_to_a_caller_naming_its_manifest(
    api: httpx.Client, bus: StreamBus, feed: WeightsFeed
) -> None:
    held = publish(bus, 5, manifest="a")
    wait_for(lambda: latest(api).status_code == 200, "the feed to read the stream")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(latest, api, after_version=5, after_sha256=held.manifest_sha256, wait_s=10)
        wait_for(lambda: feed.num_waiting == 1, "the long poll to wait")
        resumed = publish(bus, 3, manifest="b")  # restarted from an older checkpoint
        response = waiting.result(timeout=10)
    assert WeightsPublished.model_validate_json(response.content) == resumed
    assert latest(api, after_version=5).status_code == 204  # by version number alone it is not news


# the two sources a WeightsSync reads
@pytest.fixture(params=["http", "stream"])
def source(request: pytest.FixtureRequest, bus: StreamBus) -> Iterator[AnnouncementSource]:
    if request.param == "http":
        coordinator: ServedCoordinator = request.getfixturevalue("coordinator")
        token = register(coordinator.client).token
        announcements: AnnouncementSource = HttpAnnouncements(coordinator.url, lambda: token)
    else:
        announcements = StreamAnnouncements(bus)
    yield announcements
    announcements.close()


def test_a_source_answers_the_newest_announcement_and_waits_for_news(
    source: AnnouncementSource, bus: StreamBus
) -> None:
    assert source.latest() is None
    assert source.wait_newer(-1, 0.2) is None
    first = publish(bus, 1)
    bus.publish_raw(WEIGHTS, b"garbage")  # skipped by either source
    assert wait_for(source.latest, "the announcement") == first
    assert source.wait_newer(-1, 5.0) == first
    assert source.wait_newer(1, 0.2) is None
    assert source.wait_newer(1, 0.2, after_sha256=first.manifest_sha256) is None

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: (source.wait_newer(1, 10.0), time.perf_counter()))
        wait_for(lambda: waiting.running(), "the wait to start")
        newer = publish(bus, 2)
        announced_s = time.perf_counter()
        received, received_s = waiting.result(timeout=10)
    assert received == newer and received_s - announced_s < MAX_WAKE_S
    resumed = publish(bus, 1, manifest="b")  # a learner resumed from an older checkpoint
    assert source.wait_newer(2, 5.0, after_sha256=newer.manifest_sha256) == resumed


def test_an_unreachable_coordinator_is_an_outage_the_worker_retries() -> None:
    announcements = HttpAnnouncements(f"http://127.0.0.1:{free_port()}", lambda: "w-0.x", connect_timeout_s=1.0)
    try:
        with pytest.raises(CoordinatorUnavailableError):
            announcements.latest()
    finally:
        announcements.close()


def test_a_refused_token_is_retried_like_an_outage(coordinator: ServedCoordinator) -> None:
    announcements = HttpAnnouncements(coordinator.url, lambda: "w-0123456789abcdef.stale")
    try:
        with pytest.raises(TokenRefusedError) as raised:
            announcements.wait_newer(-1, 1.0)
        assert isinstance(raised.value, CoordinatorUnavailableError)
    finally:
        announcements.close()
