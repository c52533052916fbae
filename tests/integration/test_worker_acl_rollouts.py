"""A real rollout worker on a Redis with ACLs on holds no Redis credentials and opens no Redis connection:
it works only through the coordinator's work API (which runs as the coordinator's own Redis user), signs
what it hands in, and, declared dead, rejoins as itself (same id and rollout key) and carries on. Real
redis-server, the real coordinator app under uvicorn, the tiny policy, weights published by the
learner's own WeightPublisher."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from cluster.redis_acl import OPERATOR, TRUSTED_SERVICES
from engines.torch_engine import TorchEngine
from services.coordinator.redis_access import RedisAccess
from services.learner.publish import publication_state
from services.reward.provenance import ProducerCheck
from services.rollout.settings import RolloutSettings
from services.rollout.worker import RolloutWorker
from shared.bus import StreamBus
from shared.config import CoordinatorConfig, GRPOConfig, RolloutConfig, RunConfig
from shared.messages import LearnerState, TaskGroup
from shared.streams import LEARNER_STATE, ROLLOUTS, TASKS
from shared.weight_channel import ChunkServer, ChunkStore, WeightPublisher
from tests.acl_redis import AclRedis
from tests.coordinator_rest import JOIN_TOKEN, served_coordinator
from tests.manual_clock import ManualClock
from tests.polling import wait_for
from tests.weights_keys import PUBLIC_KEY_HEX, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

LEASE_S = 30.0


def publish_task(bus: StreamBus, task_id: str) -> None:
    bus.publish(
        TASKS,
        TaskGroup(
            run_id=bus.keys.run_id,
            task_id=task_id,
            task_name="arithmetic_mod10",
            prompt="3+4=",
            num_samples=2,
            max_new_tokens=2,
            temperature=1.0,
        ),
    )


def test_a_worker_without_redis_works_through_the_coordinator_and_again_after_it_rejoined(
    acl_redis: AclRedis, model_dir: Path
) -> None:
    keys = acl_redis.keys
    run = RunConfig(
        run_id=keys.run_id,
        grpo=GRPOConfig(group_size=2, groups_per_step=2),
        rollout=RolloutConfig(heartbeat_interval_s=0.2),
        coordinator=CoordinatorConfig(lease_s=LEASE_S),
    )
    learner = StreamBus(acl_redis.client_of("learner"), keys, service="learner")
    store = ChunkStore()
    chunks = ChunkServer(store, wait_s=1.0).start()
    WeightPublisher(
        learner, keys, store, public_url=chunks.url, signing_key=SIGNING_KEY, chunk_size_bytes=64 * 1024
    ).publish(publication_state(TorchEngine(model_dir).model), 0)
    learner.put_state(
        LEARNER_STATE,
        LearnerState(
            run_id=keys.run_id,
            status="training",
            learner_version=0,
            published_version=0,
            staleness_bound=2,
            num_steps_target=100,
        ),
    )
    learner.ensure_group(TASKS)
    coordinator_redis = acl_redis.client_of("coordinator")
    access = RedisAccess(coordinator_redis, keys)
    clock = ManualClock()
    check = ProducerCheck(acl_redis.client_of("reward"), keys)
    with served_coordinator(run, coordinator_redis, lease_clock=clock, access=access) as coordinator:
        settings = RolloutSettings(
            weights_public_key=PUBLIC_KEY_HEX,
            join_token=JOIN_TOKEN,
            coordinator_url=coordinator.url,
            model_dir=model_dir,
            worker_name="acl",
            worker_poll_s=0.05,
        )
        worker = RolloutWorker(run, settings, TorchEngine(model_dir))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            publish_task(learner, "before")
            first = wait_for(lambda: learner.entries(ROLLOUTS), "a rollout from the worker", timeout_s=60)
            first_id = first[0].worker_id
            check.verify(first[0])  # signed with the key its registration issued

            clock.advance(LEASE_S + 1)  # declared dead: its next heartbeat (and lease call) gets 410
            wait_for(lambda: worker.membership.num_registrations >= 2, "registration again", timeout_s=30)
            assert worker.membership.worker_id == first_id  # it rejoined as itself, with a new token
            publish_task(learner, "after")
            groups = wait_for(
                lambda: [g for g in learner.entries(ROLLOUTS) if g.task_id == "after"] or None,
                "a rollout after re-registering",
                timeout_s=60,
            )
            assert groups[0].worker_id == worker.membership.worker_id == first_id
            check.verify(groups[0])
            assert check.num_forged == 0 and learner.dead_letters() == []
            connected_as = {client["user"] for client in acl_redis.client_of(OPERATOR).client_list()}
            assert connected_as <= {*TRUSTED_SERVICES, OPERATOR}  # nobody else ever logged in: no worker user
            assert not hasattr(worker, "bus")
        finally:
            worker.stop()
            thread.join(timeout=30)
            chunks.stop()
    assert not thread.is_alive()
