"""Least privilege on Redis and rollouts bound to their producer, against a real redis-server with ACLs on
(the default user disabled, the trusted services' users from cluster/redis_acl.py), the real coordinator
app under uvicorn and the real reward service.

A registered worker's own Redis user may read and ack tasks, append rollouts and read announcements, and
nothing else; it stops working once the worker deregisters, its lease expires or it is revoked; a rollout
posted under another worker's id is dead-lettered and counted against that id, the honest one is scored.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from tokenizers import Tokenizer

from cluster.redis_acl import OPERATOR
from cluster.redis_server import RedisServer
from services.coordinator.redis_access import AclSetupError, RedisAccess, check_acl_setup, revoke_worker_access
from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.api import RegisterWorkerResponse, WorkerInfo
from shared.bus import StreamBus
from shared.config import CoordinatorConfig, RunConfig
from shared.keys import RunKeys
from shared.messages import DeadLetter, RolloutGroup, TaskGroup, WeightsPublished, pack_float32, pack_int32
from shared.rollout_mac import sign_rollout
from shared.streams import DEAD, LEARNER_STATE, ROLLOUTS, SCORED, TASKS, WEIGHTS
from tests.acl_redis import AclRedis
from tests.coordinator_rest import ADMIN_TOKEN, bearer, register, served_coordinator
from tests.manual_clock import ManualClock
from tests.polling import wait_for
from tests.rollouts import unsigned_rollout_for

pytestmark = pytest.mark.integration

LEASE_S = 5.0
DRAIN_GRACE_S = 2.0  # shorter than the lease: a draining worker that keeps heartbeating still loses its user


@dataclass(frozen=True)
class AclCoordinator:
    api: httpx.Client
    clock: ManualClock
    redis: AclRedis
    access: RedisAccess


@pytest.fixture
def coordinator(acl_redis: AclRedis) -> Iterator[AclCoordinator]:
    """The coordinator app as its own Redis user, issuing per-worker users; its leases on a hand-driven clock."""
    run = RunConfig(run_id=acl_redis.keys.run_id, coordinator=CoordinatorConfig(lease_s=LEASE_S))
    client = acl_redis.client_of("coordinator")
    access = RedisAccess(
        client, acl_redis.keys, acl=True, worker_redis_url=acl_redis.server.url, drain_grace_s=DRAIN_GRACE_S
    )
    clock = ManualClock()
    with served_coordinator(run, client, lease_clock=clock, access=access) as served:
        yield AclCoordinator(served.client, clock, acl_redis, access)
    client.close()


def worker_client(registration: RegisterWorkerResponse) -> redis.Redis:
    access = registration.access
    assert access.redis_url is not None and access.redis_username and access.redis_password
    assert "@" not in access.redis_url  # the URL carries no credentials
    return redis.Redis.from_url(access.redis_url, username=access.redis_username, password=access.redis_password)


@pytest.fixture
def seeded(acl_redis: AclRedis) -> StreamBus:
    """The run's streams as the trusted services leave them: the tasks group, a task, an announcement."""
    bus = StreamBus(acl_redis.client_of("reward"), acl_redis.keys, service="test")
    bus.ensure_group(TASKS)
    bus.publish(TASKS, task_of(acl_redis.keys.run_id, "task-0"))
    bus.publish(
        WEIGHTS,
        WeightsPublished(
            run_id=acl_redis.keys.run_id,
            policy_version=0,
            manifest_url="http://127.0.0.1:1/v0",
            manifest_sha256="0" * 64,
            total_size_bytes=1,
            num_chunks=1,
        ),
    )
    return bus


def task_of(run_id: str, task_id: str) -> TaskGroup:
    return TaskGroup(
        run_id=run_id,
        task_id=task_id,
        task_name="arithmetic_mod10",
        prompt="1+2=",
        num_samples=2,
        max_new_tokens=1,
        temperature=1.0,
    )


def rollout_of(task: TaskGroup, worker_id: str, texts: list[str]) -> RolloutGroup:
    return RolloutGroup(
        run_id=task.run_id,
        group_id=uuid.uuid4().hex,
        task_id=task.task_id,
        task_name=task.task_name,
        prompt=task.prompt,
        worker_id=worker_id,
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32([3, 4, 5, 6]),
        completion_token_ids=pack_int32([7] * len(texts)),
        completion_lengths=pack_int32([1] * len(texts)),
        behaviour_logprobs=pack_float32([-1.0] * len(texts)),
        completion_texts=texts,
        finish_reasons=["stop"] * len(texts),
        generation_s=0.01,
    )


def refused(call: Callable[[], object]) -> str:
    """The NOPERM error text of `call`; fails the test if Redis allowed it."""
    with pytest.raises(redis.exceptions.NoPermissionError) as caught:
        call()
    return str(caught.value)


def cannot_log_in(registration: RegisterWorkerResponse) -> bool:
    """True once Redis refuses the worker's credentials (a connection killed mid-revocation: not yet)."""
    client = worker_client(registration)
    try:
        client.ping()
    except redis.AuthenticationError:
        return True
    except redis.ConnectionError:  # logged in just before its user was deleted, then killed
        return False
    finally:
        client.close()
    return False


def test_a_workers_user_may_do_what_a_worker_does_and_nothing_else(coordinator: AclCoordinator, seeded) -> None:
    keys = coordinator.redis.keys
    registration = register(coordinator.api, "w")
    worker = StreamBus(worker_client(registration), keys, service="rollout")

    # what a worker does (shared/bus.py calls)
    (delivery,) = worker.read(TASKS, "c-0", count=1, block_ms=100)
    assert worker.claim_stale(TASKS, "c-0", min_idle_ms=0) != []  # XAUTOCLAIM + XPENDING
    task = delivery.message
    worker.publish_and_ack(ROLLOUTS, [rollout_of(task, registration.worker_id, ["3"])], [delivery])
    assert worker.latest(WEIGHTS) is not None and worker.wait_for_entries(WEIGHTS, after_id="0-0", block_ms=10)
    worker.publish(DEAD, a_dead_letter(keys))
    assert seeded.length(ROLLOUTS) == 1 and seeded.backlog(TASKS) == 0

    # what it must not do
    client = worker.redis
    scored, state = keys.name_of(SCORED), keys.name_of(LEARNER_STATE)
    assert "no permissions to access one of the keys" in refused(lambda: client.xadd(scored, {"data": b"x"}))
    assert "no permissions to run the 'set'" in refused(lambda: client.set(state, b"x"))
    assert "no permissions to run the 'del'" in refused(lambda: client.delete(keys.name_of(ROLLOUTS)))
    refused(lambda: client.get(keys.rollout_key(registration.worker_id)))  # nobody's signing key, its own included
    refused(lambda: client.hgetall(keys.worker(registration.worker_id)))
    refused(lambda: client.xrange(keys.name_of(DEAD)))  # dead letters: append only
    refused(lambda: client.xadd(keys.name_of(TASKS), {"data": b"x"}))
    refused(lambda: client.xadd(keys.name_of(WEIGHTS), {"data": b"x"}))  # no forged announcements
    refused(client.flushall)
    refused(lambda: client.config_get("*"))
    refused(lambda: client.execute_command("ACL", "LIST"))
    refused(lambda: client.execute_command("ACL", "SETUSER", "me", "on", "+@all"))
    refused(lambda: client.keys("*"))
    refused(lambda: client.execute_command("CLIENT", "KILL", "USER", "coordinator"))


def a_dead_letter(keys: RunKeys) -> DeadLetter:
    return DeadLetter(
        run_id=keys.run_id,
        source_stream=keys.name_of(TASKS),
        source_message_id="0-1",
        consumer_group="rollout",
        service="rollout",
        error="EngineError: test",
        payload=b"",
        num_deliveries=1,
    )


def test_without_a_user_nothing_is_allowed(acl_redis: AclRedis) -> None:
    bare = redis.Redis.from_url(acl_redis.server.url)
    with pytest.raises(redis.exceptions.AuthenticationError):  # the default user is off
        bare.ping()


def test_deregistration_deletes_the_user_and_kills_its_connections(coordinator: AclCoordinator, seeded) -> None:
    registration = register(coordinator.api, "w")
    connected = worker_client(registration)
    assert connected.ping()
    response = coordinator.api.delete(f"/v1/workers/{registration.worker_id}", headers=bearer(registration.token))
    assert response.status_code == 204
    assert cannot_log_in(registration)
    with pytest.raises(redis.ConnectionError):  # the open connection was killed; it cannot log in again
        connected.ping()


def test_lease_expiry_revokes_the_user(coordinator: AclCoordinator, seeded) -> None:
    registration = register(coordinator.api, "w")
    alive = register(coordinator.api, "alive")
    assert worker_client(registration).ping()
    coordinator.clock.advance(LEASE_S + 1)
    response = coordinator.api.post(f"/v1/workers/{alive.worker_id}/heartbeat", headers=bearer(alive.token), json={})
    assert response.status_code == 410  # both leases ran out on the hand-driven clock
    wait_for(lambda: cannot_log_in(registration) and cannot_log_in(alive), "the sweeper to revoke both users")
    fresh = register(coordinator.api, "fresh")  # a live lease keeps its user across sweeps
    info = wait_for(lambda: coordinator.api.get("/v1/workers").json(), "the worker list")
    assert fresh.worker_id in {WorkerInfo.model_validate(w).worker_id for w in info}
    assert worker_client(fresh).ping()


def test_a_worker_draining_past_the_grace_period_loses_its_user(coordinator: AclCoordinator, seeded) -> None:
    registration = register(coordinator.api, "w")
    drained = coordinator.api.post(f"/v1/workers/{registration.worker_id}/drain", headers=bearer(ADMIN_TOKEN))
    assert drained.status_code == 200
    assert coordinator.access.revoke_gone(coordinator.clock()) == []  # within the grace: finishing its batch
    assert worker_client(registration).ping()
    coordinator.clock.advance(DRAIN_GRACE_S + 1)  # still within its lease
    wait_for(lambda: cannot_log_in(registration), "the sweeper to revoke the draining worker")
    assert WorkerInfo.model_validate(coordinator.api.get(f"/v1/workers/{registration.worker_id}").json()).state == (
        "draining"
    )


def test_revoke_worker_access_is_what_quarantine_calls(coordinator: AclCoordinator, seeded) -> None:
    registration = register(coordinator.api, "w")
    acl = coordinator.redis
    trusted = acl.client_of("coordinator")
    revoke_worker_access(trusted, acl.keys, registration.worker_id, retention_s=60)
    assert cannot_log_in(registration)
    assert 0 < trusted.ttl(acl.keys.rollout_key(registration.worker_id)) <= 60  # its groups in flight still verify
    revoke_worker_access(trusted, acl.keys, registration.worker_id)  # idempotent


def test_worker_users_survive_a_redis_restart(coordinator: AclCoordinator, seeded) -> None:
    registration = register(coordinator.api, "w")
    server = coordinator.redis.server
    server.stop()
    server.start()
    assert worker_client(registration).ping()  # ACL SAVE wrote it to the ACL file


@contextlib.contextmanager
def reward_service(acl: AclRedis, model_dir: Path) -> Iterator[RewardService]:
    run = RunConfig.model_validate({"run_id": acl.keys.run_id, "grpo": {"group_size": 2, "groups_per_step": 2}})
    bus = StreamBus(acl.client_of("reward"), acl.keys, service="reward")
    settings = RewardSettings(redis_url=acl.server.url, poll_block_ms=50, model_dir=model_dir)
    service = RewardService(run, settings, bus)
    thread = threading.Thread(target=service.run_forever, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        service.stop_event.set()
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_a_rollout_under_another_workers_id_is_dead_lettered_and_the_honest_one_scored(
    coordinator: AclCoordinator, model_dir: Path
) -> None:
    acl = coordinator.redis
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def rollout_by(worker_id: str, task: TaskGroup, texts: list[str]) -> RolloutGroup:
        return unsigned_rollout_for(task, texts, tokenizer, worker_id=worker_id)

    honest, liar = register(coordinator.api, "honest"), register(coordinator.api, "liar")
    honest_bus = StreamBus(worker_client(honest), acl.keys, service="rollout")
    liar_bus = StreamBus(worker_client(liar), acl.keys, service="rollout")
    observer = StreamBus(acl.client_of(OPERATOR), acl.keys, service="test")
    with reward_service(acl, model_dir) as service:
        wait_for(lambda: observer.length(TASKS) >= 2, "tasks from the reward service")
        (mine,) = honest_bus.read(TASKS, "honest", count=1, block_ms=100)
        (theirs,) = liar_bus.read(TASKS, "liar", count=1, block_ms=100)
        honest_key, liar_key = (bytes.fromhex(r.access.rollout_key_hex) for r in (honest, liar))
        a, b = (int(c) for c in mine.message.prompt.rstrip("=").split("+"))
        right = str((a + b) % 10)
        honest_bus.publish_and_ack(
            ROLLOUTS, [sign_rollout(rollout_by(honest.worker_id, mine.message, [right, right]), honest_key)], [mine]
        )
        # the liar posts under the honest worker's id: signed with its own key, or not at all
        as_honest = rollout_by(honest.worker_id, theirs.message, ["0", "0"])
        liar_bus.publish_and_ack(ROLLOUTS, [sign_rollout(as_honest, liar_key), as_honest], [theirs])

        letters = wait_for(lambda: len(observer.dead_letters()) == 2 and observer.dead_letters(), "two dead letters")
        assert all(letter.error.startswith("forged rollout: ") for letter in letters)
        wait_for(lambda: observer.length(SCORED) == 1, "the honest group scored")
        (scored,) = observer.entries(SCORED)
        assert scored.rollout.worker_id == honest.worker_id and scored.rewards == [1.0, 1.0]
        info = WorkerInfo.model_validate(coordinator.api.get(f"/v1/workers/{honest.worker_id}").json())
        assert info.num_rollouts_forged == 2  # counted against the id it claimed
        wait_for(
            lambda: any(
                line.startswith("relayrl_fleet_worker_rollouts_forged_total{")
                and honest.worker_id in line
                and line.endswith(" 2.0")
                for line in coordinator.api.get("/metrics").text.splitlines()
            ),
            "the count in the coordinator's /metrics",
        )
        assert service.producers.num_forged == 2
        (next_task,) = honest_bus.read(TASKS, "honest", count=1, block_ms=100)
        honest_bus.publish(
            ROLLOUTS, sign_rollout(rollout_by(honest.worker_id, next_task.message, ["1", "2"]), honest_key)
        )
        wait_for(lambda: service.num_scored == 2, "the service to keep scoring")  # it kept running
    assert coordinator.api.get("/v1/workers", headers=bearer(ADMIN_TOKEN)).status_code == 200


def test_the_coordinator_checks_at_start_that_acls_can_mean_something(
    acl_redis: AclRedis, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator_url = acl_redis.users.url_for("coordinator", acl_redis.server.url)
    assert check_acl_setup(acl_redis.client_of("coordinator"), coordinator_url)
    with pytest.raises(AclSetupError, match="cannot manage users"):  # a user without +acl
        check_acl_setup(acl_redis.client_of("reward"), acl_redis.users.url_for("reward", acl_redis.server.url))
    bare = redis.Redis.from_url(redis_server.url)  # a Redis whose default user is on: any worker could use it
    assert not check_acl_setup(bare, redis_server.url)
    assert "accepts connections without credentials" in caplog.text
    bare.close()
