"""The coordinator's REST API served by a real uvicorn on a free port, against a real redis-server."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cluster.ports import free_port
from shared.api import StatusResponse, WorkerInfo
from shared.bus import StreamBus
from shared.config import CoordinatorConfig, RunConfig, ScheduleConfig
from shared.keys import RunKeys
from shared.messages import LearnerState, TaskGroup
from shared.streams import GROUPED_STREAMS, LEARNER_STATE, ROLLOUTS, TASKS
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, bearer, register, served_coordinator
from tests.manual_clock import ManualClock
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def run_config(run_id: str, *, lease_s: float = 5.0, staleness_bound: int = 2) -> RunConfig:
    return RunConfig(
        run_id=run_id,
        coordinator=CoordinatorConfig(lease_s=lease_s),
        schedule=ScheduleConfig(staleness_bound=staleness_bound),
    )


StartCoordinator = Callable[..., httpx.Client]


@pytest.fixture
def start_coordinator(serve_coordinator: ServeCoordinator, keys: RunKeys) -> StartCoordinator:
    """start(lease_s=..., staleness_bound=..., lease_clock=...) -> a client of a fresh coordinator app on
    this test's run; with `lease_clock`, its leases run on that clock instead of the wall clock."""

    def start(lease_clock: ManualClock | None = None, **run_overrides: float) -> httpx.Client:
        return serve_coordinator(run_config(keys.run_id, **run_overrides), lease_clock=lease_clock).client

    return start


@pytest.fixture
def api(start_coordinator: StartCoordinator) -> httpx.Client:
    return start_coordinator()


def write_learner_state(client: redis.Redis, keys: RunKeys, *, learner_version: int, staleness_bound: int) -> None:
    state = LearnerState(
        run_id=keys.run_id,
        status="training",
        learner_version=learner_version,
        published_version=learner_version,
        staleness_bound=staleness_bound,
        num_steps_target=100,
        num_dropped={"stale": 3},
        last_reward_mean=0.25,
        busy_fraction=0.9,
    )
    client.set(keys.name_of(LEARNER_STATE), state.encode())


# workers and leases


def test_registered_worker_heartbeats_and_is_listed_with_its_version(api: httpx.Client, keys: RunKeys) -> None:
    worker = register(api, name="gpu-a", price_per_hour=0.4)
    assert worker.worker_id.startswith("w-")
    assert (worker.run_id, worker.lease_s, worker.staleness_bound) == (keys.run_id, 5.0, 2)

    response = api.post(
        f"/v1/workers/{worker.worker_id}/heartbeat",
        headers=bearer(worker.token),
        json={
            "policy_version": 3,
            "num_groups_done": 2,
            "num_samples_done": 16,
            "samples_per_s": 8.0,
            "generating": True,
        },
    )

    assert response.status_code == 200, response.text
    assert response.json()["state"] == "active"
    assert response.json()["learner_version"] == 0
    listed = [WorkerInfo.model_validate(item) for item in api.get("/v1/workers").json()]
    # the samples it claims are not stored: only the work API's accepted groups count (none here)
    assert [(w.worker_id, w.name, w.policy_version, w.num_samples_done, w.generating) for w in listed] == [
        (worker.worker_id, "gpu-a", 3, 0, True)
    ]
    assert WorkerInfo.model_validate(api.get(f"/v1/workers/{worker.worker_id}").json()) == listed[0]


def test_token_is_stored_only_as_its_sha256(api: httpx.Client, redis_client: redis.Redis, keys: RunKeys) -> None:
    worker = register(api)
    stored = redis_client.hgetall(keys.worker(worker.worker_id))
    assert worker.token.encode() not in stored.values()
    assert len(stored[b"token_sha256"]) == 64


def test_worker_whose_lease_expires_is_dead_and_must_register_again(
    start_coordinator: StartCoordinator, clock: ManualClock
) -> None:
    api = start_coordinator(lease_s=0.5, lease_clock=clock)
    worker = register(api)
    clock.advance(0.7)

    assert api.get(f"/v1/workers/{worker.worker_id}").json()["state"] == "dead"
    response = api.post(f"/v1/workers/{worker.worker_id}/heartbeat", headers=bearer(worker.token), json={})
    assert response.status_code == 410
    assert "register again" in response.json()["detail"]
    again = register(api)
    assert again.worker_id != worker.worker_id
    assert api.post(f"/v1/workers/{again.worker_id}/heartbeat", headers=bearer(again.token), json={}).status_code == 200


def test_heartbeats_keep_a_short_lease_alive(start_coordinator: StartCoordinator, clock: ManualClock) -> None:
    api = start_coordinator(lease_s=0.5, lease_clock=clock)
    worker = register(api)
    for _ in range(6):  # 0.9 s in all: well past one lease
        clock.advance(0.15)
        assert (
            api.post(f"/v1/workers/{worker.worker_id}/heartbeat", headers=bearer(worker.token), json={}).status_code
            == 200
        )
    assert api.get(f"/v1/workers/{worker.worker_id}").json()["state"] == "active"


def test_sweeper_marks_expired_workers_dead_without_any_reader(
    start_coordinator: StartCoordinator, redis_client: redis.Redis, keys: RunKeys, clock: ManualClock
) -> None:
    api = start_coordinator(lease_s=0.5, lease_clock=clock)
    worker = register(api)
    clock.advance(0.6)
    wait_for(  # read Redis, not the API: the sweeper (a pass every lease_s / 4) alone marks it
        lambda: redis_client.hget(keys.worker(worker.worker_id), "state") == b"dead",
        "the sweeper to expire the worker",
        timeout_s=3,
    )
    assert redis_client.zscore(keys.worker_leases, worker.worker_id) is None


# authentication and authorization


def test_heartbeat_needs_the_workers_own_token(api: httpx.Client) -> None:
    worker, other = register(api), register(api)
    url = f"/v1/workers/{worker.worker_id}/heartbeat"
    forged = worker.worker_id + ".not-the-secret"

    assert api.post(url, json={}).status_code == 401
    assert api.post(url, json={}, headers={"Authorization": f"Basic {worker.token}"}).status_code == 401
    for token in ["garbage", forged]:
        response = api.post(url, json={}, headers=bearer(token))
        assert response.status_code == 401, token
        assert response.headers["www-authenticate"] == "Bearer"
    assert api.post(url, json={}, headers=bearer(other.token)).status_code == 403
    assert api.post(url, json={}, headers=bearer(ADMIN_TOKEN)).status_code == 403
    assert (
        api.post("/v1/workers/w-0000000000000000/heartbeat", json={}, headers=bearer(worker.token)).status_code == 404
    )
    assert api.post(url, json={}, headers=bearer(worker.token)).status_code == 200


def test_a_worker_cannot_deregister_another_but_itself_and_the_admin_can(api: httpx.Client) -> None:
    first, second = register(api), register(api)

    assert api.delete(f"/v1/workers/{first.worker_id}", headers=bearer(second.token)).status_code == 403
    assert api.delete(f"/v1/workers/{first.worker_id}").status_code == 401
    assert api.delete(f"/v1/workers/{first.worker_id}", headers=bearer(first.token)).status_code == 204
    assert api.delete(f"/v1/workers/{second.worker_id}", headers=bearer(ADMIN_TOKEN)).status_code == 204

    assert api.get("/v1/workers").json() == []
    assert api.get(f"/v1/workers/{first.worker_id}").status_code == 404
    assert api.delete(f"/v1/workers/{first.worker_id}", headers=bearer(ADMIN_TOKEN)).status_code == 404
    # the token died with its worker
    assert api.post(f"/v1/workers/{first.worker_id}/heartbeat", headers=bearer(first.token), json={}).status_code == 401


def test_unknown_worker_is_404(api: httpx.Client) -> None:
    response = api.get("/v1/workers/w-0123456789abcdef")
    assert response.status_code == 404
    assert "w-0123456789abcdef" in response.json()["detail"]


# validation


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"price_per_hour": "cheap"}, "price_per_hour"),
        ({"price_per_hour": -1.0}, "price_per_hour"),
        ({"bandwidth_mbps": 0}, "bandwidth_mbps"),
        ({"name": ""}, "name"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_malformed_registration_is_422_naming_the_field(api: httpx.Client, body: dict, field: str) -> None:
    response = api.post("/v1/workers", json=body)
    assert response.status_code == 422
    assert [error["loc"][-1] for error in response.json()["detail"]] == [field]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"policy_version": "latest"}, "policy_version"),
        ({"policy_version": -2}, "policy_version"),
        ({"num_groups_done": -1}, "num_groups_done"),
        ({"samples_per_s": -0.5}, "samples_per_s"),
        ({"generating": "maybe"}, "generating"),
        ({"lease_s": 100}, "lease_s"),
    ],
)
def test_malformed_heartbeat_is_422_naming_the_field(api: httpx.Client, body: dict, field: str) -> None:
    worker = register(api)
    response = api.post(f"/v1/workers/{worker.worker_id}/heartbeat", headers=bearer(worker.token), json=body)
    assert response.status_code == 422
    assert [error["loc"][-1] for error in response.json()["detail"]] == [field]


def test_body_that_is_not_json_is_422(api: httpx.Client) -> None:
    response = api.post("/v1/workers", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 422


# staleness gate


@pytest.mark.parametrize(
    ("learner_version", "policy_version", "staleness_bound"),
    [(0, 0, 0), (5, 5, 0), (5, 4, 0), (10, 8, 2), (10, 7, 2), (10, 3, 7), (10, 2, 7), (3, 4, 2), (100, 0, 100)],
)
def test_staleness_follows_t_minus_v_within_s(
    start_coordinator: StartCoordinator,
    redis_client: redis.Redis,
    keys: RunKeys,
    learner_version: int,
    policy_version: int,
    staleness_bound: int,
) -> None:
    api = start_coordinator(staleness_bound=staleness_bound)
    write_learner_state(redis_client, keys, learner_version=learner_version, staleness_bound=staleness_bound)

    body = api.get("/v1/staleness", params={"policy_version": policy_version}).json()

    lag = learner_version - policy_version
    assert body == {
        "policy_version": policy_version,
        "learner_version": learner_version,
        "staleness_bound": staleness_bound,
        "admissible": 0 <= lag <= staleness_bound,
        "steps_remaining": staleness_bound - lag,
    }


def test_staleness_before_the_learner_starts_is_against_version_0(start_coordinator: StartCoordinator) -> None:
    api = start_coordinator(staleness_bound=1)
    body = api.get("/v1/staleness", params={"policy_version": 0}).json()
    assert (body["learner_version"], body["staleness_bound"], body["admissible"], body["steps_remaining"]) == (
        0,
        1,
        True,
        1,
    )


@pytest.mark.parametrize("params", [{}, {"policy_version": -1}, {"policy_version": "new"}])
def test_staleness_needs_a_non_negative_version(api: httpx.Client, params: dict) -> None:
    response = api.get("/v1/staleness", params=params)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "policy_version"]


# status


def test_status_shows_stream_depths_dead_letters_learner_and_workers(
    api: httpx.Client, bus: StreamBus, redis_client: redis.Redis, keys: RunKeys
) -> None:
    assert StatusResponse.model_validate(api.get("/v1/status").json()).learner is None
    for stream in GROUPED_STREAMS:
        bus.ensure_group(stream)
    for index in range(3):
        bus.publish(
            TASKS,
            TaskGroup(
                run_id=keys.run_id,
                task_id=f"t{index}",
                task_name="arithmetic_mod10",
                prompt="1+1=",
                num_samples=4,
                max_new_tokens=2,
                temperature=1.0,
            ),
        )
    delivered = bus.read(TASKS, "w1", count=1, block_ms=100)  # pending: still counted
    bus.publish_raw(ROLLOUTS, b"\xc1 not msgpack")
    assert bus.read(ROLLOUTS, "r1", count=1, block_ms=100) == []  # dead-lettered
    write_learner_state(redis_client, keys, learner_version=12, staleness_bound=2)
    worker = register(api)

    status = StatusResponse.model_validate(api.get("/v1/status").json())

    assert status.run_id == keys.run_id and status.staleness_bound == 2
    assert status.stream_depths == {"tasks": 3, "rollouts": 0, "scored": 0, "dead": 1}
    assert status.num_dead_letters == 1
    assert status.learner is not None
    assert (status.learner.learner_version, status.learner.status, status.learner.num_dropped) == (
        12,
        "training",
        {"stale": 3},
    )
    assert [w.worker_id for w in status.workers] == [worker.worker_id]
    bus.ack(TASKS, [d.message_id for d in delivered])
    assert api.get("/v1/status").json()["stream_depths"]["tasks"] == 2


# restarts and service plumbing


def test_a_restarted_coordinator_sees_every_worker_and_accepts_their_tokens(
    redis_client: redis.Redis, keys: RunKeys
) -> None:
    run = run_config(keys.run_id)
    with served_coordinator(run, redis_client) as first:
        workers = [register(first.client, name=f"w{i}") for i in range(3)]

    with served_coordinator(run, redis_client) as coordinator:
        second = coordinator.client
        listed = second.get("/v1/workers").json()
        assert sorted(w["worker_id"] for w in listed) == sorted(w.worker_id for w in workers)
        assert all(w["state"] == "active" for w in listed)
        response = second.post(
            f"/v1/workers/{workers[0].worker_id}/heartbeat", headers=bearer(workers[0].token), json={}
        )
        assert response.status_code == 200


def test_healthz_and_openapi_document_every_endpoint(api: httpx.Client) -> None:
    assert api.get("/healthz").json() == {"ok": True}
    paths = api.get("/openapi.json").json()["paths"]
    assert set(paths) >= {
        "/v1/workers",
        "/v1/workers/{worker_id}",
        "/v1/workers/{worker_id}/heartbeat",
        "/v1/staleness",
        "/v1/status",
        "/healthz",
    }
    assert "410" in paths["/v1/workers/{worker_id}/heartbeat"]["post"]["responses"]
    assert api.get("/docs").status_code == 200


def test_redis_outage_is_503_not_a_crash(keys: RunKeys) -> None:
    unreachable = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with served_coordinator(run_config(keys.run_id), unreachable) as coordinator:
        api = coordinator.client
        response = api.get("/v1/workers")
        assert response.status_code == 503
        assert "redis" in response.json()["detail"]
        assert api.get("/healthz").status_code == 200
