"""Dead workers are pruned after `dead_worker_retention_s` (issue 10, item 8): 3,000 registrations that
expired once made /v1/status 1.3 MiB and 197 ms for good. Until they are pruned, status lists a bounded
page of them (the live first, then the most recently dead) and counts the rest; after pruning, their
records, set membership and per-worker hashes are gone while the run's cost totals keep what they cost.
A real uvicorn, a real redis-server, a hand-driven lease clock."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from services.coordinator.ledger import WorkerBill
from shared.api import STATUS_MAX_WORKERS, RegisterWorkerRequest, StatusResponse
from shared.config import CoordinatorConfig, CredentialConfig, RunConfig
from shared.keys import RunKeys
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, ServedCoordinator, bearer, register
from tests.manual_clock import ManualClock
from tests.polling import wait_for

pytestmark = pytest.mark.integration

LEASE_S = 5.0
RETENTION_S = 60.0
NUM_FLEET = 3000


def timed_status(api: httpx.Client) -> tuple[int, float, StatusResponse]:
    """(bytes, milliseconds, body) of one GET /v1/status."""
    started = time.perf_counter()
    response = api.get("/v1/status")
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, response.text[:300]
    return len(response.content), elapsed_ms, StatusResponse.model_validate_json(response.content)


def serve(serve_coordinator: ServeCoordinator, keys: RunKeys, clock: ManualClock) -> ServedCoordinator:
    """Leases on `clock`; billing on a clock stopped at 1000 s, so only the test bills (at 1000 s and after)."""
    run = RunConfig(
        run_id=keys.run_id,
        coordinator=CoordinatorConfig(lease_s=LEASE_S, dead_worker_retention_s=RETENTION_S),
        credentials=CredentialConfig(max_workers=NUM_FLEET + 1),  # the fleet is live under one credential at first
    )
    return serve_coordinator(run, lease_clock=clock, control_clock=ManualClock(1000.0))


def prune_all(served: ServedCoordinator, keys: RunKeys, redis_client: redis.Redis, expected: int) -> None:
    control = served.app.state.control
    wait_for(
        lambda: control.run_once() is not None and redis_client.scard(keys.worker_ids) == expected,
        "the dead workers are pruned",
        timeout_s=60,
    )


def test_thousands_of_expired_workers_are_pruned_and_status_stays_small_and_fast(
    serve_coordinator: ServeCoordinator, keys: RunKeys, redis_client: redis.Redis, clock: ManualClock
) -> None:
    served = serve(serve_coordinator, keys, clock)
    registry = served.app.state.coordinator.registry
    for i in range(NUM_FLEET):  # the registry directly: REST registration is tested elsewhere, this is about size
        registry.register(f"w-{i:016x}", RegisterWorkerRequest(name=f"fleet-{i}"), token_sha256=f"digest-{i}")
    survivor = register(served.client, "survivor")
    clock.advance(LEASE_S + 1)
    beat = served.client.post(f"/v1/workers/{survivor.worker_id}/heartbeat", json={}, headers=bearer(survivor.token))
    assert beat.status_code == 410  # the survivor too: it rejoins below, after the fleet is pruned
    registry.expire_due()
    before_bytes, before_ms, before = timed_status(served.client)
    assert len(before.workers) == STATUS_MAX_WORKERS and before_bytes < 64 * 1024
    assert before.num_workers_by_state == {"dead": NUM_FLEET + 1}
    assert before.workers[0].worker_id == survivor.worker_id  # the most recently dead first

    clock.advance(RETENTION_S)
    again = served.client.post(
        "/v1/workers",
        json={"name": "survivor", "previous_worker_id": survivor.worker_id},
        headers=bearer(survivor.token),
    )
    assert again.json()["rejoined"] is True  # alive again: not due for pruning
    prune_all(served, keys, redis_client, expected=1)
    after_bytes, after_ms, after = timed_status(served.client)

    print(
        f"/v1/status with {NUM_FLEET} dead workers: {before_bytes} B, {before_ms:.1f} ms; pruned: {after_bytes} B, {after_ms:.1f} ms"
    )
    assert [w.worker_id for w in after.workers] == [survivor.worker_id]
    assert after.num_workers_by_state == {"active": 1}
    assert after_bytes < 4096
    left = {key.decode() for key in redis_client.scan_iter(match=keys.worker("*"), count=1000)}
    assert left == {keys.worker(survivor.worker_id)}  # no record of the fleet left behind
    assert redis_client.zcard(keys.worker_leases) == 1
    assert redis_client.zcard(keys.worker_dead) == 0


def test_a_pruned_worker_keeps_its_cost_in_the_totals_and_its_hashes_go(
    serve_coordinator: ServeCoordinator, keys: RunKeys, redis_client: redis.Redis, clock: ManualClock
) -> None:
    served = serve(serve_coordinator, keys, clock)
    worker = register(served.client, "priced", price_per_hour=3.6)
    control = served.app.state.control
    control.ledger.bill(1000.0, 0.0, {worker.worker_id: WorkerBill(3.6, 0, flagged=False)})
    control.ledger.bill(1010.0, 0.0, {worker.worker_id: WorkerBill(3.6, 0, flagged=False)})  # 10 s at $3.6/h: $0.01
    control.ledger.bill(1010.0, 0.0, {worker.worker_id: WorkerBill(3.6, 1, flagged=False)})  # backed by a scored group
    redis_client.hset(keys.broadcast_last_swap, worker.worker_id, "3:1000.0")
    redis_client.hset(keys.broadcast_throughput, worker.worker_id, "812.5")
    before = served.client.get("/v1/cost", headers=bearer(ADMIN_TOKEN)).json()
    assert before["usd_by_worker"] == {worker.worker_id: pytest.approx(0.01)}

    clock.advance(LEASE_S + RETENTION_S + 1)
    prune_all(served, keys, redis_client, expected=0)

    after = served.client.get("/v1/cost", headers=bearer(ADMIN_TOKEN)).json()
    assert after["usd_by_worker"] == {}
    assert after["workers_usd"] == pytest.approx(before["workers_usd"])
    assert after["total_usd"] == pytest.approx(before["total_usd"])
    assert not redis_client.hexists(keys.broadcast_last_swap, worker.worker_id)
    assert not redis_client.hexists(keys.broadcast_throughput, worker.worker_id)
    assert not [field for field in redis_client.hkeys(keys.cost_ledger) if worker.worker_id.encode() in field]
    assert not redis_client.exists(keys.worker(worker.worker_id))
    assert served.client.get(f"/v1/workers/{worker.worker_id}").status_code == 404


def test_dead_records_an_older_coordinator_left_are_indexed_and_pruned(
    serve_coordinator: ServeCoordinator, keys: RunKeys, redis_client: redis.Redis, clock: ManualClock
) -> None:
    served = serve(serve_coordinator, keys, clock)
    registry = served.app.state.coordinator.registry
    old, live = (registry.register(f"w-{i:016x}", RegisterWorkerRequest(name=n), f"d-{i}") for i, n in enumerate("ol"))
    # as an older coordinator left it: dead, out of the leases, never indexed
    redis_client.zrem(keys.worker_leases, old.worker_id)
    redis_client.hset(keys.worker(old.worker_id), "state", "dead")

    assert registry.index_the_dead() == 1
    assert registry.list_dead(10)[0].worker_id == old.worker_id and len(registry.list_live()) == 1
    clock.advance(LEASE_S + RETENTION_S + 1)
    prune_all(served, keys, redis_client, expected=0)  # both dead long enough: the indexed one pruned too
    assert not redis_client.exists(keys.worker(old.worker_id)) and not redis_client.exists(keys.worker(live.worker_id))
