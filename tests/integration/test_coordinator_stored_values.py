"""The coordinator's control computations are robust to any stored value (issue 10, item 8): one stored
T_bcast of inf once made every control pass raise OverflowError, even after a restart. Here each stored
measurement the control loop and the endpoints read is overwritten straight in Redis with inf, nan,
1e308, a negative number and a non-number; the next control pass must not raise, every control
endpoint answers 200, and the bad value is counted in relayrl_coordinator_bad_measurements_total. Also:
swap reports of versions the learner never announced, or swapped before the announcement or after
now, are ignored and counted, and the per-version hashes stay bounded. A real uvicorn, a real redis-server."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
import msgpack
import pytest
import redis

from services.coordinator.announcements import MAX_ANNOUNCED_VERSIONS
from shared.api import RegisterWorkerResponse
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import LearnerState
from shared.streams import LEARNER_STATE
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, ServedCoordinator, announce, bearer, register

pytestmark = pytest.mark.integration

BAD_VALUES = ["inf", "nan", "1e308", "-5", "not-a-number"]
NEGATIVE_IS_FINE = {"learner.last_reward_mean"}  # a mean reward may be -5: stored, used, not counted
CONTROL_ROUTES = [
    "/v1/capacity",
    "/v1/activation",
    "/v1/cost",
    "/v1/status",
    "/v1/dashboard",
    "/dashboard",
    "/metrics",
    "/v1/broadcast/times",
    "/v1/broadcast/plan",
    "/v1/workers",
]
BAD_COUNTER = re.compile(r"^relayrl_coordinator_bad_measurements_total\{[^}]*\} (\S+)$", re.M)


def bad_count(api: httpx.Client) -> float:
    return sum(float(v) for v in BAD_COUNTER.findall(api.get("/metrics").text))


def seed(served: ServedCoordinator, redis_client: redis.Redis, keys: RunKeys) -> list[RegisterWorkerResponse]:
    """A run with something in every stored measurement: two workers (one priced) with throughput and a
    swap of an announced version, a learner state that makes the capacity model known, a bill, a history."""
    api = served.client
    workers = [register(api, "free"), register(api, "priced", price_per_hour=1.5)]
    announced_at_s = time.time()  # after both registered: both count for its T_bcast
    announce(redis_client, keys.run_id, 1, announced_at_s)
    for worker in workers:
        swapped_at_s = announced_at_s + 0.001
        swap = {"policy_version": 1, "announced_at_s": announced_at_s, "swapped_at_s": swapped_at_s, "num_bytes": 1}
        swap |= {"pause_s": 0.0005, "ready_at_s": announced_at_s}
        body = {"policy_version": 1, "samples_per_s": 40.0, "group_latency_s": 0.5, "last_swap": swap}
        assert api.post(f"/v1/workers/{worker.worker_id}/heartbeat", json=body, headers=bearer(worker.token)).is_success
    state = LearnerState(
        run_id=keys.run_id,
        status="training",
        learner_version=3,
        published_version=3,
        staleness_bound=2,
        num_steps_target=100,
        num_steps_done=3,
        train_s_total=1.5,
        idle_s_total=0.3,
        wall_s=2.4,
        busy_fraction=0.6,
    )
    StreamBus(redis_client, keys, service="test-learner").put_state(LEARNER_STATE, state)
    announce(redis_client, keys.run_id, 2, time.time())  # pending: every pass reads its swaps and announcement
    body = {"policy_version": 2, "last_swap": {**swap, "policy_version": 2, "swapped_at_s": time.time()}}
    api.post(f"/v1/workers/{workers[0].worker_id}/heartbeat", json=body, headers=bearer(workers[0].token))
    served.app.state.control.run_once()
    served.app.state.control.run_once(time.time() + 1)  # a second pass bills a second
    assert redis_client.hget(keys.broadcast_times, "1") is not None  # every stored measurement exists now
    assert redis_client.hget(keys.broadcast_splits, "1") is not None
    assert redis_client.hexists(keys.broadcast_swap_splits(2), workers[0].worker_id)
    assert redis_client.llen(keys.learner_history) >= 1
    assert redis_client.zscore(keys.broadcast_pending, "2") is not None
    return workers


def assert_control_plane_answers(served: ServedCoordinator) -> None:
    served.app.state.control.run_once()  # raises if the pass is poisoned
    for route in CONTROL_ROUTES:
        response = served.client.get(route, headers=bearer(ADMIN_TOKEN))
        assert response.status_code == 200, (route, response.status_code, response.text[:300])


Writer = Callable[[redis.Redis, RunKeys, list[RegisterWorkerResponse], str], None]


def worker_field(name: str) -> Writer:
    def write(client: redis.Redis, keys: RunKeys, workers: list[RegisterWorkerResponse], value: str) -> None:
        client.hset(keys.worker(workers[1].worker_id), name, value)

    return write


def hash_field(key: Callable[[RunKeys], str], field: Callable[[list[RegisterWorkerResponse]], str]) -> Writer:
    def write(client: redis.Redis, keys: RunKeys, workers: list[RegisterWorkerResponse], value: str) -> None:
        client.hset(key(keys), field(workers), value)

    return write


def learner_field(name: str) -> Writer:
    def write(client: redis.Redis, keys: RunKeys, workers: list[RegisterWorkerResponse], value: str) -> None:
        raw = msgpack.unpackb(client.get(keys.name_of(LEARNER_STATE)))
        raw[name] = float(value) if value != "not-a-number" else value
        client.set(keys.name_of(LEARNER_STATE), msgpack.packb(raw))

    return write


def history_point(client: redis.Redis, keys: RunKeys, workers: list[RegisterWorkerResponse], value: str) -> None:
    client.rpush(
        keys.learner_history,
        f'{{"learner_version": 9, "reward_mean": {value}, "utilization": 0.5, "cost_usd": 1, "at_s": 1}}',
    )


def pending_version(client: redis.Redis, keys: RunKeys, workers: list[RegisterWorkerResponse], value: str) -> None:
    client.zadd(keys.broadcast_pending, {value: 1.0})
    client.hset(keys.broadcast_announced, value, "1.0")


def completing_swap_split(
    client: redis.Redis, keys: RunKeys, workers: list[RegisterWorkerResponse], value: str
) -> None:
    """A new version every worker swapped, one with `value` as its ready time and pause: the next pass
    completes the version, the only time these are read."""
    version = 100 + client.zcard(keys.broadcast_pending) + client.hlen(keys.broadcast_times)
    at_s = time.time()
    client.hset(keys.broadcast_announced, str(version), repr(at_s))
    client.zadd(keys.broadcast_pending, {str(version): at_s})
    client.hset(keys.broadcast_swaps(version), mapping={w.worker_id: repr(at_s + 0.001) for w in workers})
    client.hset(keys.broadcast_swap_splits(version), workers[0].worker_id, value)


STORED: dict[str, Writer] = {
    **{
        f"worker.{name}": worker_field(name)
        for name in (
            "samples_per_s",
            "tokens_per_s",
            "group_latency_s",
            "policy_version",
            "num_groups_done",
            "price_per_hour",
            "bandwidth_mbps",
            "state_since_s",
            "registered_at_s",
            "lease_expires_at_s",
        )
    },
    "broadcast.times": hash_field(lambda k: k.broadcast_times, lambda w: "1"),
    "broadcast.times key": hash_field(lambda k: k.broadcast_times, lambda w: "junk-version"),
    "broadcast.announced": hash_field(lambda k: k.broadcast_announced, lambda w: "2"),
    "broadcast.published": hash_field(lambda k: k.broadcast_published, lambda w: "2"),
    "broadcast.splits": hash_field(lambda k: k.broadcast_splits, lambda w: "1"),
    "broadcast.swap_splits": completing_swap_split,
    "broadcast.swaps": hash_field(lambda k: k.broadcast_swaps(2), lambda w: w[0].worker_id),
    "broadcast.last_swap": hash_field(lambda k: k.broadcast_last_swap, lambda w: w[0].worker_id),
    "broadcast.throughput": hash_field(lambda k: k.broadcast_throughput, lambda w: w[0].worker_id),
    "broadcast.pending": pending_version,
    "ledger.billed_until_s": hash_field(lambda k: k.cost_ledger, lambda w: "billed_until_s"),
    "ledger.total_usd": hash_field(lambda k: k.cost_ledger, lambda w: "total_usd"),
    "ledger.worker": hash_field(lambda k: k.cost_ledger, lambda w: "worker:" + w[1].worker_id),
    "ledger.pending": hash_field(lambda k: k.cost_ledger, lambda w: "pending:" + w[1].worker_id),
    "ledger.window": hash_field(lambda k: k.cost_ledger, lambda w: "window:" + w[1].worker_id),
    "ledger.verified": hash_field(lambda k: k.cost_ledger, lambda w: "verified:" + w[1].worker_id),
    "learner.train_s_total": learner_field("train_s_total"),
    "learner.wall_s": learner_field("wall_s"),
    "learner.busy_fraction": learner_field("busy_fraction"),
    "learner.last_reward_mean": learner_field("last_reward_mean"),
    "learner.history": history_point,
}


@pytest.mark.parametrize("stored", sorted(STORED))
def test_a_bad_stored_measurement_is_dropped_and_counted_and_never_poisons_the_control_loop(
    serve_coordinator: ServeCoordinator, redis_client: redis.Redis, keys: RunKeys, stored: str
) -> None:
    served = serve_coordinator(RunConfig(run_id=keys.run_id))
    workers = seed(served, redis_client, keys)
    for value in BAD_VALUES:
        before = bad_count(served.client)
        STORED[stored](redis_client, keys, workers, value)
        if stored.startswith("ledger"):  # billing resets a bad stored amount (and counts it)
            served.app.state.control.run_once(time.time() + 2)
        assert_control_plane_answers(served)
        if not (value == "-5" and stored in NEGATIVE_IS_FINE):
            assert bad_count(served.client) > before, (stored, value)


def test_swap_reports_of_unannounced_versions_or_impossible_times_are_ignored_and_counted(
    serve_coordinator: ServeCoordinator, redis_client: redis.Redis, keys: RunKeys
) -> None:
    served = serve_coordinator(RunConfig(run_id=keys.run_id))
    api = served.client
    worker = register(api, "liar")
    now_s = time.time()
    redis_client.hset(keys.worker(worker.worker_id), "registered_at_s", repr(now_s - 100))  # counts for version 1
    announce(redis_client, keys.run_id, 1, now_s - 5.0)

    def report(version: int, swapped_at_s: float) -> None:
        swap = {"policy_version": version, "announced_at_s": 0.0, "swapped_at_s": swapped_at_s, "num_bytes": 1}
        body = {"policy_version": version, "last_swap": swap}
        response = api.post(f"/v1/workers/{worker.worker_id}/heartbeat", json=body, headers=bearer(worker.token))
        assert response.status_code == 200, response.text

    for version in range(1000, 1300):  # versions the learner never published
        report(version, now_s)
    report(1, now_s - 60.0)  # before version 1 was announced
    report(1, time.time() + 3600)  # in the future

    metrics = api.get("/metrics").text  # counted per coordinator: this one saw exactly these reports
    assert 'relayrl_coordinator_ignored_swap_reports_total{reason="unannounced"} 300.0' in metrics
    assert 'relayrl_coordinator_ignored_swap_reports_total{reason="time"} 2.0' in metrics
    assert not list(redis_client.scan_iter(match=keys.prefix + "broadcast:swaps:1[0-9][0-9][0-9]"))
    assert set(redis_client.hkeys(keys.broadcast_announced)) == {b"1"}
    assert redis_client.zcard(keys.broadcast_pending) <= 1
    assert not redis_client.hexists(keys.broadcast_last_swap, worker.worker_id)

    report(1, now_s - 2.0)  # an honest report: 3 s after the learner's announcement
    times = api.get("/v1/broadcast/times").json()["seconds_by_version"]
    assert times == {"1": pytest.approx(3.0, abs=0.01)}  # from the learner's published_at_s, not the report's


def test_the_announcements_kept_are_bounded(
    serve_coordinator: ServeCoordinator, redis_client: redis.Redis, keys: RunKeys
) -> None:
    serve_coordinator(RunConfig(run_id=keys.run_id))
    for version in range(MAX_ANNOUNCED_VERSIONS + 40):
        announce(redis_client, keys.run_id, version, time.time())
    kept = sorted(int(v) for v in redis_client.hkeys(keys.broadcast_announced))
    assert kept == list(range(40, MAX_ANNOUNCED_VERSIONS + 40))
    assert sorted(int(v) for v in redis_client.hkeys(keys.broadcast_published)) == kept


def test_a_swap_reported_before_the_coordinator_read_the_announcement_still_counts(
    serve_coordinator: ServeCoordinator, redis_client: redis.Redis, keys: RunKeys
) -> None:
    api = serve_coordinator(RunConfig(run_id=keys.run_id)).client
    worker = register(api, "quick")
    published_at_s = time.time()
    announce(redis_client, keys.run_id, 4, published_at_s, ingest=False)  # on the stream, not read yet
    swap = {"policy_version": 4, "announced_at_s": 0.0, "swapped_at_s": published_at_s + 0.25, "num_bytes": 1}
    response = api.post(
        f"/v1/workers/{worker.worker_id}/heartbeat",
        json={"policy_version": 4, "last_swap": swap},
        headers=bearer(worker.token),
    )
    assert response.status_code == 200
    assert float(redis_client.hget(keys.broadcast_announced, "4")) == pytest.approx(published_at_s)
    assert api.get("/v1/broadcast/times").json()["seconds_by_version"] == {"4": pytest.approx(0.25, abs=1e-3)}
