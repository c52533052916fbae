"""The coordinator's broadcast API against a real redis-server: the relay plan and each worker's parent
follow joins and deaths; swap reports from heartbeats become T_bcast per version."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from services.coordinator.app import create_app
from shared.api import (
    BroadcastTimesResponse,
    ParentResponse,
    RegisterWorkerResponse,
    RelayPlanResponse,
)
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.streams import WEIGHTS
from tests.coordinator_rest import ADMIN_TOKEN, announce, register

pytestmark = pytest.mark.integration

LEARNER_URL = "http://learner:8100"


@pytest.fixture
def api(redis_client: redis.Redis, keys: RunKeys) -> Iterator[httpx.Client]:
    app = create_app(RunConfig(run_id=keys.run_id), redis_client, ADMIN_TOKEN)
    with TestClient(app) as client:  # no sweeper needed: every read applies due lease expiries
        yield client


def register_relay(api: httpx.Client, name: str, mbps: float) -> RegisterWorkerResponse:
    """A worker whose chunk server is http://<name>:9000 and whose link is `mbps`."""
    return register(api, name, endpoint_url=f"http://{name}:9000", bandwidth_mbps=mbps)


def plan(api: httpx.Client) -> dict[str, tuple[str, int]]:
    """name -> (parent id, depth)."""
    body = RelayPlanResponse.model_validate(api.get("/v1/broadcast/plan").json())
    return {a.name: (a.parent_id, a.depth) for a in body.assignments}


def parent(api: httpx.Client, worker: RegisterWorkerResponse) -> ParentResponse:
    response = api.get(f"/v1/workers/{worker.worker_id}/parent")
    assert response.status_code == 200, response.text
    return ParentResponse.model_validate(response.json())


def heartbeat(api: httpx.Client, worker: RegisterWorkerResponse, **last_swap: float) -> None:
    body = (
        {"policy_version": int(last_swap["policy_version"]), "last_swap": {**last_swap, "num_bytes": 1000}}
        if last_swap
        else {}
    )
    response = api.post(
        f"/v1/workers/{worker.worker_id}/heartbeat", json=body, headers={"Authorization": f"Bearer {worker.token}"}
    )
    assert response.status_code == 200, response.text


def test_the_plan_chains_workers_by_bandwidth_and_follows_joins_and_deaths(
    api: httpx.Client, bus: StreamBus, keys: RunKeys, redis_client: redis.Redis
) -> None:
    bus.publish(
        WEIGHTS,
        WeightsPublished(
            run_id=keys.run_id,
            policy_version=0,
            manifest_url=f"{LEARNER_URL}/v1/weights/0/manifest",
            manifest_sha256="0" * 64,
            total_size_bytes=10,
            num_chunks=1,
        ),
    )
    slow, fast, middle = (
        register_relay(api, "slow", 100),
        register_relay(api, "fast", 900),
        register_relay(api, "middle", 500),
    )

    assert plan(api) == {"fast": ("learner", 1), "middle": (fast.worker_id, 2), "slow": (middle.worker_id, 3)}
    seed = parent(api, fast)
    assert (seed.parent_id, seed.parent_url, seed.learner_url) == ("learner", "", LEARNER_URL)
    tail = parent(api, slow)
    assert (tail.parent_url, tail.fallback_urls) == ("http://middle:9000", ["http://fast:9000"])
    assert api.get("/v1/broadcast/plan").json()["assignments"][0]["parent_url"] == LEARNER_URL

    newcomer = register_relay(api, "newcomer", 2000)  # a join re-plans: the fastest becomes the seed
    assert plan(api)["newcomer"] == ("learner", 1) and plan(api)["fast"] == (newcomer.worker_id, 2)

    redis_client.zadd(keys.worker_leases, {middle.worker_id: time.time() - 1})  # middle's lease ran out
    assert "middle" not in plan(api)
    assert parent(api, slow).parent_url == "http://fast:9000"  # its grandparent takes over
    assert api.get(f"/v1/workers/{middle.worker_id}/parent").status_code == 410
    assert api.get("/v1/workers/w-unknown/parent").status_code == 404


def test_swap_reports_in_heartbeats_become_the_broadcast_time_of_each_version(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    announced_at_s = time.time() - 10  # the learner's clock: every swap below happened before now
    first, second = register_relay(api, "first", 100), register_relay(api, "second", 100)
    for version, after_s in ((3, 0.0), (4, 3.0), (5, 4.0)):
        announce(redis_client, keys.run_id, version, announced_at_s + after_s)
    redis_client.hset(keys.worker(first.worker_id), "registered_at_s", repr(announced_at_s - 1))
    redis_client.hset(keys.worker(second.worker_id), "registered_at_s", repr(announced_at_s - 1))

    heartbeat(api, first, policy_version=3, announced_at_s=announced_at_s, swapped_at_s=announced_at_s + 1.5)
    assert redis_client.hget(keys.broadcast_times, "3") is None  # the second worker has not swapped yet
    heartbeat(
        api, first, policy_version=3, announced_at_s=announced_at_s, swapped_at_s=announced_at_s + 1.5
    )  # repeated
    heartbeat(api, second, policy_version=3, announced_at_s=announced_at_s, swapped_at_s=announced_at_s + 2.25)

    assert float(redis_client.hget(keys.broadcast_times, "3")) == pytest.approx(2.25)  # announcement -> last swap
    # version 4 completes although the first worker jumped straight to 5 (it never held 4)
    heartbeat(api, second, policy_version=4, announced_at_s=announced_at_s + 3, swapped_at_s=announced_at_s + 3.5)
    heartbeat(api, first, policy_version=5, announced_at_s=announced_at_s + 4, swapped_at_s=announced_at_s + 4.2)
    heartbeat(api, second, policy_version=5, announced_at_s=announced_at_s + 4, swapped_at_s=announced_at_s + 4.9)
    late = register_relay(api, "late", 100)  # joined after version 5 was announced: not part of its broadcast
    heartbeat(api, late, policy_version=5, announced_at_s=announced_at_s + 4, swapped_at_s=time.time())

    times = BroadcastTimesResponse.model_validate(api.get("/v1/broadcast/times").json())
    assert times.seconds_by_version == {3: pytest.approx(2.25), 4: pytest.approx(0.5), 5: pytest.approx(0.9)}
    assert (times.num_versions, times.max_s, times.last_s) == (3, pytest.approx(2.25), pytest.approx(0.9))
    assert times.mean_s == pytest.approx((2.25 + 0.5 + 0.9) / 3, abs=1e-3)
