"""The coordinator's broadcast API against a real redis-server: the relay plan and each worker's parent
follow joins and deaths; swap reports from heartbeats become T_bcast per version."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from services.coordinator.app import create_app
from services.coordinator.broadcast_times import DEADLINE_S, BroadcastTimes, RelayKeys
from shared.api import (
    BroadcastTimesResponse,
    ParentResponse,
    RegisterWorkerResponse,
    RelayPlanResponse,
    WorkerInfo,
)
from shared.bus import StreamBus
from shared.config import BroadcastConfig, RunConfig
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.streams import WEIGHTS
from tests.coordinator_rest import ADMIN_TOKEN, announce, register

pytestmark = pytest.mark.integration

LEARNER_URL = "http://learner:8100"


@pytest.fixture
def api(redis_client: redis.Redis, keys: RunKeys) -> Iterator[httpx.Client]:
    # the workers' chunk servers are names nobody serves (http://fast:9000): taken as reachable, not probed
    # (probing: tests/integration/test_relay_reachability.py)
    run = RunConfig(run_id=keys.run_id, broadcast=BroadcastConfig(probe_inbound=False))
    app = create_app(run, redis_client, ADMIN_TOKEN)
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


def report_swap(api: httpx.Client, worker: RegisterWorkerResponse, **swap: float | None) -> httpx.Response:
    """A heartbeat carrying `swap` (WeightSwapReport fields; num_bytes and announced_at_s filled in)."""
    body = {"policy_version": int(swap["policy_version"] or 0), "last_swap": {"num_bytes": 1000, **swap}}
    body["last_swap"].setdefault("announced_at_s", 0.0)  # the worker's claim: never used
    return api.post(  # json.dumps writes NaN and Infinity as JavaScript does (what a hostile client may send)
        f"/v1/workers/{worker.worker_id}/heartbeat",
        content=json.dumps(body),
        headers={"Authorization": f"Bearer {worker.token}", "Content-Type": "application/json"},
    )


def registered_before(redis_client: redis.Redis, keys: RunKeys, at_s: float, *workers: RegisterWorkerResponse) -> None:
    for worker in workers:
        redis_client.hset(keys.worker(worker.worker_id), "registered_at_s", repr(at_s))


def test_t_bcast_counts_from_the_publication_start_and_each_version_keeps_its_rollout_pause(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    start_s = time.time() - 20  # the learner's optimizer step ended; publishing v1 took 0.5 s
    first, second = register_relay(api, "first", 100), register_relay(api, "second", 100)
    registered_before(redis_client, keys, start_s - 1, first, second)
    announce(redis_client, keys.run_id, 1, start_s + 0.5, publish_started_at_s=start_s)
    assert float(redis_client.hget(keys.broadcast_announced, "1")) == start_s
    assert float(redis_client.hget(keys.broadcast_published, "1")) == start_s + 0.5

    ok = report_swap(api, first, policy_version=1, swapped_at_s=start_s + 1.25, ready_at_s=start_s + 1.0, pause_s=0.1)
    assert ok.status_code == 200, ok.text
    assert report_swap(api, first, policy_version=1, swapped_at_s=start_s + 1.25, pause_s=9.0).status_code == 200
    ok = report_swap(api, second, policy_version=1, swapped_at_s=start_s + 2.0, ready_at_s=start_s + 1.5, pause_s=0.3)
    assert ok.status_code == 200, ok.text
    # v2: the first worker is older and reports no pause; the second reports one longer than its own swap
    # could have taken (a load cannot start before the publication did): clamped to swap - start
    announce(redis_client, keys.run_id, 2, start_s + 10.4, publish_started_at_s=start_s + 10.0)
    assert report_swap(api, first, policy_version=2, swapped_at_s=start_s + 11.0).status_code == 200
    assert report_swap(api, second, policy_version=2, swapped_at_s=start_s + 10.6, pause_s=5.0).status_code == 200

    times = BroadcastTimesResponse.model_validate(api.get("/v1/broadcast/times").json())
    # from the publication start, not from the announcement (which would say 1.5 and 0.6)
    assert times.seconds_by_version == {1: pytest.approx(2.0), 2: pytest.approx(1.0)}
    assert times.window == "learner publish start -> engine sampling with the version"
    v1, v2 = times.splits_by_version[1], times.splits_by_version[2]
    assert (v1.publish_s, v1.transfer_s, v1.ready_s) == (pytest.approx(0.5), pytest.approx(1.5), pytest.approx(1.5))
    # the first report of a swap counts (the repeat's 9.0 is not news), like the swap time
    assert (v1.pause_mean_s, v1.pause_max_s, v1.num_paused) == (pytest.approx(0.2), pytest.approx(0.3), 2)
    assert (v2.publish_s, v2.transfer_s, v2.ready_s) == (pytest.approx(0.4), pytest.approx(0.6), None)
    assert (v2.pause_mean_s, v2.pause_max_s, v2.num_paused) == (pytest.approx(0.6), pytest.approx(0.6), 1)
    # over every counted swap that reported one: (0.1 + 0.3 + 0.6) / 3
    assert (times.pause_mean_s, times.pause_max_s) == (pytest.approx(1.0 / 3, abs=1e-3), pytest.approx(0.6))

    metrics = api.get("/metrics").text
    assert "relayrl_broadcast_rollout_pause_seconds 0.333" in metrics
    assert "relayrl_broadcast_rollout_pause_max_seconds 0.6" in metrics


def test_an_announcement_without_a_publication_start_measures_from_its_publication(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    published_at_s = time.time() - 20
    worker = register_relay(api, "only", 100)
    registered_before(redis_client, keys, published_at_s - 1, worker)
    announce(redis_client, keys.run_id, 1, published_at_s)  # an older learner: publish_started_at_s is 0.0
    # not read by the coordinator yet: the heartbeat script decodes the stream entries itself
    announce(redis_client, keys.run_id, 2, published_at_s + 5.0, ingest=False)
    announce(
        redis_client, keys.run_id, 3, published_at_s + 10.0, publish_started_at_s=published_at_s + 9.0, ingest=False
    )
    for version, swapped_after_s in ((1, 0.75), (2, 5.5), (3, 10.25)):
        response = report_swap(api, worker, policy_version=version, swapped_at_s=published_at_s + swapped_after_s)
        assert response.status_code == 200, response.text

    times = BroadcastTimesResponse.model_validate(api.get("/v1/broadcast/times").json())
    assert times.seconds_by_version == {1: pytest.approx(0.75), 2: pytest.approx(0.5), 3: pytest.approx(1.25)}
    assert float(redis_client.hget(keys.broadcast_announced, "3")) == published_at_s + 9.0  # found by the script
    assert [times.splits_by_version[v].publish_s for v in (1, 2, 3)] == [0.0, 0.0, pytest.approx(1.0)]
    assert times.splits_by_version[1].num_paused == 0 and times.pause_mean_s is None


def test_a_swap_before_the_publication_start_is_ignored_one_before_the_announcement_is_not(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    start_s = time.time() - 20
    early, honest = register_relay(api, "early", 100), register_relay(api, "honest", 100)
    registered_before(redis_client, keys, start_s - 1, early, honest)
    announce(redis_client, keys.run_id, 1, start_s + 5.0, publish_started_at_s=start_s)

    assert report_swap(api, early, policy_version=1, swapped_at_s=start_s - 3.0).status_code == 200
    assert not redis_client.hexists(keys.broadcast_swaps(1), early.worker_id)  # before the start, beyond the skew
    # inside the clock skew tolerated around the learner's start (a swap before the announcement is one)
    assert report_swap(api, honest, policy_version=1, swapped_at_s=start_s + 1.0).status_code == 200
    assert redis_client.hexists(keys.broadcast_swaps(1), honest.worker_id)
    assert 'relayrl_coordinator_ignored_swap_reports_total{reason="time"} 1.0' in api.get("/metrics").text


@pytest.mark.parametrize(
    "swap",
    [
        {"pause_s": -0.1},
        {"pause_s": 86_401.0},
        {"pause_s": float("nan")},
        {"pause_s": float("inf")},
        {"pause_s": "fast"},
        {"ready_at_s": -1.0},
        {"ready_at_s": 2e10},
        {"ready_at_s": 1.0},  # after swapped_at_s: weights cannot be loaded before they are ready
    ],
    ids=[
        "negative-pause",
        "pause-over-a-day",
        "nan-pause",
        "inf-pause",
        "text-pause",
        "negative-ready",
        "ready-in-2600",
        "ready-after-swap",
    ],
)
def test_out_of_bound_pause_or_readiness_is_refused_and_nothing_is_recorded(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys, swap: dict
) -> None:
    worker = register_relay(api, "hostile", 100)
    announce(redis_client, keys.run_id, 1, 0.25)
    response = report_swap(api, worker, policy_version=1, swapped_at_s=0.5, **swap)
    assert response.status_code == 422, response.text
    assert not redis_client.exists(keys.broadcast_swaps(1), keys.broadcast_swap_splits(1))


def test_a_worker_that_never_swaps_does_not_stop_t_bcast(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    """Issue 23, attack 10: one silent worker kept every version pending. Of 4 counted workers T_bcast
    waits for 3 (all but max(1, n // 10)): the silent one is the one left out."""
    start_s = time.time() - 30
    workers = [register_relay(api, f"w{i}", 100) for i in range(4)]
    silent, honest = workers[0], workers[1:]
    registered_before(redis_client, keys, start_s - 1, *workers)
    for version in (1, 2, 3):
        announce(redis_client, keys.run_id, version, start_s + version, publish_started_at_s=start_s + version)
        for i, worker in enumerate(honest):
            swapped_at_s = start_s + version + 0.5 * (i + 1)
            assert report_swap(api, worker, policy_version=version, swapped_at_s=swapped_at_s).status_code == 200
    heartbeat(api, silent)  # alive and active, never a swap

    times = BroadcastTimesResponse.model_validate(api.get("/v1/broadcast/times").json())
    assert times.seconds_by_version == {1: pytest.approx(1.5), 2: pytest.approx(1.5), 3: pytest.approx(1.5)}
    assert redis_client.zcard(keys.broadcast_pending) == 0


def test_a_version_short_of_its_quorum_is_measured_at_its_deadline(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    """Of 2 counted workers both count (one of two is no outlier); with one silent, the version is measured
    DEADLINE_S after its publication start from the swap that arrived, not held forever."""
    start_s = time.time() - 10
    silent, honest = register_relay(api, "silent", 100), register_relay(api, "honest", 100)
    registered_before(redis_client, keys, start_s - 1, silent, honest)
    announce(redis_client, keys.run_id, 1, start_s, publish_started_at_s=start_s)
    assert report_swap(api, honest, policy_version=1, swapped_at_s=start_s + 2.0).status_code == 200
    times = BroadcastTimes(redis_client, keys)
    workers = [WorkerInfo.model_validate(api.get(f"/v1/workers/{w.worker_id}").json()) for w in (silent, honest)]

    assert times.complete_pending(workers, now_s=start_s + DEADLINE_S - 1) == {}  # the silent one may still come
    assert times.complete_pending(workers, now_s=start_s + DEADLINE_S) == {1: pytest.approx(2.0)}


def test_relay_poisoning_a_parent_that_serves_nothing_is_a_leaf_after_its_childs_report(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    """Issue 23, attack 7, through the coordinator: the liar claims 10 Gbit/s and seeds the first plan; its
    child fetches the version elsewhere and says so in its swap report (parent_bytes 0); from then on the
    liar has no children and is nobody's fallback, until its probation (2 versions) ends."""
    start_s = time.time() - 30
    liar, fast, slow = (
        register_relay(api, "liar", 10_000),
        register_relay(api, "fast", 200),
        register_relay(api, "slow", 100),
    )
    registered_before(redis_client, keys, start_s - 1, liar, fast, slow)
    announce(redis_client, keys.run_id, 1, start_s, publish_started_at_s=start_s)
    assert plan(api) == {"liar": ("learner", 1), "fast": (liar.worker_id, 2), "slow": (fast.worker_id, 3)}
    assert parent(api, fast).parent_url == "http://liar:9000"  # served: its report may now speak of the liar
    # a child may speak only of the parent it was served: slow never asked, so this report is ignored
    stray = {"parent_url": "http://fast:9000", "parent_bytes": 0, "num_bytes": 8 << 20}
    assert report_swap(api, slow, policy_version=1, swapped_at_s=start_s + 20, **stray).status_code == 200

    # the liar stalled the stream; fast fell back to the learner for all 8 MiB
    missed = {"parent_url": "http://liar:9000", "parent_bytes": 0, "num_bytes": 8 << 20, "ready_at_s": start_s + 15}
    assert report_swap(api, fast, policy_version=1, swapped_at_s=start_s + 16, **missed).status_code == 200

    assert plan(api) == {"fast": ("learner", 1), "slow": (fast.worker_id, 2), "liar": (slow.worker_id, 3)}
    assert parent(api, fast).parent_id == "learner"
    assert "http://liar:9000" not in parent(api, slow).fallback_urls
    assert redis_client.hgetall(RelayKeys.of(keys).misses) == {b"http://liar:9000": b"1 1"}

    # slow's delivery through fast is observed; the liar's probation ends 2 versions after its miss
    delivered = {"parent_url": "http://fast:9000", "parent_bytes": 8 << 20, "num_bytes": 8 << 20}
    announce(redis_client, keys.run_id, 2, start_s + 20, publish_started_at_s=start_s + 20)
    assert report_swap(api, slow, policy_version=2, swapped_at_s=start_s + 21, **delivered).status_code == 200
    assert plan(api)["liar"] == (slow.worker_id, 3)
    announce(redis_client, keys.run_id, 3, start_s + 25, publish_started_at_s=start_s + 25)
    # a newcomer again, ranked at most at the slowest observed delivery (fast's 67 Mbit/s), not 10 Gbit/s
    assert plan(api) == {"fast": ("learner", 1), "liar": (fast.worker_id, 2), "slow": (liar.worker_id, 3)}
