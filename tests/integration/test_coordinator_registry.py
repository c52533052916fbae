"""WorkerRegistry against a real redis-server, with a hand-driven clock: leases, expiry, restarts."""

from __future__ import annotations

import pytest
import redis

from services.coordinator.auth import issue_worker_token, new_worker_id, token_sha256
from services.coordinator.worker_registry import UnknownWorkerError, WorkerDeadError, WorkerRegistry
from shared.api import HeartbeatRequest, RegisterWorkerRequest, WorkerState
from shared.keys import RunKeys
from tests.manual_clock import ManualClock

pytestmark = pytest.mark.integration

LEASE_S = 5.0


@pytest.fixture
def registry(redis_client: redis.Redis, keys: RunKeys, clock: ManualClock) -> WorkerRegistry:
    return WorkerRegistry(redis_client, keys, lease_s=LEASE_S, clock=clock)


def register(registry: WorkerRegistry, name: str = "w", price_per_hour: float = 0.5) -> str:
    worker_id = new_worker_id()
    request = RegisterWorkerRequest(name=name, price_per_hour=price_per_hour, endpoint_url="http://10.0.0.1:9000")
    registry.register(worker_id, request, token_sha256(issue_worker_token(worker_id)))
    return worker_id


def test_registered_worker_is_active_with_its_registration_fields(registry: WorkerRegistry, clock: ManualClock) -> None:
    worker_id = register(registry, name="gpu-a", price_per_hour=1.25)

    info = registry.get(worker_id)

    assert info.state == WorkerState.ACTIVE
    assert (info.name, info.price_per_hour, info.endpoint_url) == ("gpu-a", 1.25, "http://10.0.0.1:9000")
    assert info.policy_version == -1 and info.generating is False
    assert info.lease_expires_at_s == clock.now_s + LEASE_S


def test_heartbeat_extends_the_lease_and_records_progress(registry: WorkerRegistry, clock: ManualClock) -> None:
    worker_id = register(registry)
    clock.advance(LEASE_S - 0.1)

    info = registry.heartbeat(
        worker_id,
        HeartbeatRequest(policy_version=7, num_groups_done=3, num_samples_done=24, samples_per_s=12.5, generating=True),
    )

    assert info.lease_expires_at_s == clock.now_s + LEASE_S
    assert info.policy_version == 7
    assert (info.num_groups_done, info.num_samples_done) == (0, 0)  # claimed, never stored: the work API counts
    assert info.samples_per_s == 12.5 and info.generating is True
    assert info.last_heartbeat_s == clock.now_s
    clock.advance(LEASE_S - 0.1)  # past the first lease, within the extended one
    assert registry.expire_due() == []
    assert registry.get(worker_id).state == WorkerState.ACTIVE


def test_expired_lease_makes_the_worker_dead_and_its_heartbeat_fails(
    registry: WorkerRegistry, clock: ManualClock
) -> None:
    dying, living = register(registry), register(registry)
    clock.advance(LEASE_S / 2)
    registry.heartbeat(living, HeartbeatRequest())
    clock.advance(LEASE_S / 2)  # exactly the dying worker's expiry: dead

    assert registry.expire_due() == [dying]
    assert registry.get(dying).state == WorkerState.DEAD
    assert registry.get(living).state == WorkerState.ACTIVE
    with pytest.raises(WorkerDeadError):
        registry.heartbeat(dying, HeartbeatRequest())
    assert registry.expire_due() == []  # already expired: nothing left to do


def test_heartbeat_after_expiry_fails_even_before_any_sweep(registry: WorkerRegistry, clock: ManualClock) -> None:
    worker_id = register(registry)
    clock.advance(LEASE_S + 1)

    with pytest.raises(WorkerDeadError):
        registry.heartbeat(worker_id, HeartbeatRequest())
    assert registry.get(worker_id).state == WorkerState.DEAD


def test_readers_see_expired_workers_as_dead_without_a_sweep(registry: WorkerRegistry, clock: ManualClock) -> None:
    worker_id = register(registry)
    clock.advance(LEASE_S + 1)

    assert [(w.worker_id, w.state) for w in registry.list_workers()] == [(worker_id, WorkerState.DEAD)]


def test_deregistered_worker_is_unknown(registry: WorkerRegistry, redis_client: redis.Redis, keys: RunKeys) -> None:
    worker_id = register(registry)

    registry.deregister(worker_id)

    with pytest.raises(UnknownWorkerError):
        registry.get(worker_id)
    with pytest.raises(UnknownWorkerError):
        registry.heartbeat(worker_id, HeartbeatRequest())
    with pytest.raises(UnknownWorkerError):
        registry.deregister(worker_id)
    assert registry.token_sha256_of(worker_id) is None
    assert registry.list_workers() == []
    assert redis_client.zscore(keys.worker_leases, worker_id) is None


def test_a_new_registry_on_the_same_redis_sees_every_worker(
    registry: WorkerRegistry, redis_client: redis.Redis, keys: RunKeys, clock: ManualClock
) -> None:
    worker_ids = [register(registry, name=f"w{i}") for i in range(3)]
    registry.heartbeat(worker_ids[1], HeartbeatRequest(policy_version=4))

    restarted = WorkerRegistry(redis_client, keys, lease_s=LEASE_S, clock=clock)

    listed = restarted.list_workers()
    assert sorted(w.worker_id for w in listed) == sorted(worker_ids)
    assert restarted.get(worker_ids[1]).policy_version == 4
    assert restarted.list_workers() == registry.list_workers()


def test_list_is_ordered_by_registration_time(registry: WorkerRegistry, clock: ManualClock) -> None:
    worker_ids = []
    for i in range(4):
        worker_ids.append(register(registry, name=f"w{i}"))
        clock.advance(0.01)

    assert [w.worker_id for w in registry.list_workers()] == worker_ids
