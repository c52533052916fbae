"""The reward service against a real redis-server: task feed with backpressure, scoring, dead letters."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import RolloutGroup, TaskGroup, pack_float32, pack_int32
from shared.rollout_mac import sign_rollout
from shared.streams import ROLLOUTS, SCORED, TASKS
from tests.polling import CallCounter, wait_for

pytestmark = pytest.mark.integration

TEST_WORKER_ROLLOUT_KEY = bytes(range(32))  # what the coordinator would have issued worker "w-test"


def issue_test_rollout_key(client: redis.Redis, keys: RunKeys) -> None:
    client.set(keys.rollout_key("w-test"), TEST_WORKER_ROLLOUT_KEY)


@pytest.fixture
def run(run_id: str) -> RunConfig:
    return RunConfig.model_validate(
        {"run_id": run_id, "grpo": {"group_size": 4, "groups_per_step": 3}, "schedule": {"staleness_bound": 3}}
    )


@pytest.fixture
def service(run: RunConfig, bus: StreamBus, keys: RunKeys, redis_server) -> Iterator[RewardService]:
    issue_test_rollout_key(bus.redis, keys)
    settings = RewardSettings(redis_url=redis_server.url, poll_block_ms=50)
    reward = RewardService(run, settings, bus)
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    yield reward
    reward.stop_event.set()
    thread.join(timeout=10)
    assert not thread.is_alive()


def rollout_for(task: TaskGroup, texts: list[str], task_id: str | None = None) -> RolloutGroup:
    """A group worker "w-test" sampled for `task`, signed with its rollout key."""
    return sign_rollout(unsigned_rollout_for(task, texts, task_id), TEST_WORKER_ROLLOUT_KEY)


def unsigned_rollout_for(task: TaskGroup, texts: list[str], task_id: str | None = None) -> RolloutGroup:
    return RolloutGroup(
        run_id=task.run_id,
        group_id=uuid.uuid4().hex,
        task_id=task_id or task.task_id,
        task_name=task.task_name,
        prompt=task.prompt,
        worker_id="w-test",
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


def wait_until_on_disk(client: redis.Redis) -> None:
    """Every write so far survives a kill -9 of Redis: an AOF rewrite writes the whole dataset as the
    AOF's new base file and fsyncs it; wait for that rewrite to finish."""
    num_rewrites = client.info("persistence")["aof_rewrites"]
    client.bgrewriteaof()

    def rewritten() -> bool:
        info = client.info("persistence")
        return info["aof_rewrites"] > num_rewrites and not info["aof_rewrite_in_progress"]

    wait_for(rewritten, "the AOF rewrite")
    assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"


def take_tasks(bus: StreamBus, keys: RunKeys, count: int) -> list[TaskGroup]:
    deliveries = bus.read(TASKS, "w-test", count=count, block_ms=100)
    bus.ack(TASKS, [d.message_id for d in deliveries])
    return [d.message for d in deliveries]


def test_task_feed_holds_the_pipeline_at_groups_per_step_times_s_plus_one(service, bus, keys, run) -> None:
    turns = CallCounter(service, "serve_once")  # every turn of its loop tops the feed up first
    wait_for(lambda: bus.length(TASKS) >= 6, "the first tasks")
    turns.wait_for_more(2, "two more turns of the service's loop")
    assert bus.length(TASKS) == run.max_groups_in_flight == 6  # 3 groups/step * (S=3 - 1)
    task = bus.read(TASKS, "w-test", count=1, block_ms=100)[0].message
    assert task.num_samples == 4 and task.run_id == run.run_id
    turns.wait_for_more(2, "two more turns of the service's loop after a task was taken")
    assert bus.length(TASKS) == 6  # taken but not finished: still in flight, nothing added


def test_rollouts_are_scored_by_the_verifier_and_acked(service, bus, keys) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    task = take_tasks(bus, keys, 1)[0]
    a, b = (int(c) for c in task.prompt.rstrip("=").split("+"))
    right = str((a + b) % 10)
    wrong = str((a + b + 1) % 10)
    bus.publish(ROLLOUTS, rollout_for(task, [right, wrong, right + right, ""]))

    scored = wait_for(
        lambda: bus.read(SCORED, "learner-test", count=1, block_ms=50),
        "the scored group",
    )
    assert scored[0].message.rewards == [1.0, 0.0, 0.5, 0.0]
    wait_for(lambda: bus.backlog(ROLLOUTS) == 0, "the rollout acked")
    assert bus.dead_letters() == []


def test_bad_rollouts_are_dead_lettered_and_the_service_keeps_scoring(service, bus, keys) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    task = take_tasks(bus, keys, 1)[0]
    bus.publish_raw(ROLLOUTS, b"garbage")
    bus.publish(ROLLOUTS, rollout_for(task, ["1"], task_id="forged-task"))
    bus.publish(ROLLOUTS, rollout_for(task, ["1", "2"]))

    wait_for(lambda: bus.length(SCORED) == 1, "the good rollout scored")
    letters = wait_for(lambda: bus.dead_letters() if len(bus.dead_letters()) == 2 else None, "two dead letters")
    errors = sorted(letter.error for letter in letters)
    assert "not msgpack" in errors[0]
    assert "no reference for task forged-task" in errors[1]
    assert service.num_scored == 1


def test_the_service_waits_out_a_redis_restart_and_loses_nothing(run: RunConfig, tmp_path) -> None:
    from cluster.redis_server import RedisServer
    from shared.bus import connect

    server = RedisServer(tmp_path / "redis").start()
    keys = RunKeys(run.run_id)
    own_bus = StreamBus(connect(server.url, socket_timeout_s=2.0), keys, service="reward")
    reward = RewardService(run, RewardSettings(redis_url=server.url, poll_block_ms=50), own_bus)
    turns = CallCounter(reward, "serve_once")
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    try:
        test_bus = StreamBus(connect(server.url), keys, service="test")
        issue_test_rollout_key(test_bus.redis, keys)
        wait_for(lambda: test_bus.length(TASKS) >= 2, "tasks")
        task = take_tasks(test_bus, keys, 1)[0]
        wait_until_on_disk(test_bus.redis)  # the tasks and their references survive the kill -9
        server.kill()
        num_failed = turns.num_raised
        wait_for(lambda: turns.num_raised > num_failed, "the service to hit connection errors")
        assert thread.is_alive()
        server.start()
        test_bus.publish(ROLLOUTS, rollout_for(task, ["0", "1"]))
        scored = wait_for(lambda: test_bus.length(SCORED) == 1, "the rollout scored after the restart", timeout_s=20)
        assert scored and thread.is_alive()
        assert test_bus.dead_letters() == []
    finally:
        reward.stop_event.set()
        thread.join(timeout=10)
        server.stop()


def test_forged_rollouts_are_dead_lettered_and_counted_against_the_claimed_worker(service, bus, keys) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    task = take_tasks(bus, keys, 1)[0]
    bus.redis.hset(keys.worker("w-test"), mapping={"num_rollouts_forged": 0})  # the claimed worker's record
    bus.publish(ROLLOUTS, unsigned_rollout_for(task, ["1"]))  # no mac at all
    bus.publish(ROLLOUTS, sign_rollout(unsigned_rollout_for(task, ["1"]), bytes(32)))  # another key
    stranger = sign_rollout(unsigned_rollout_for(task, ["1"]).model_copy(update={"worker_id": "w-nobody"}), bytes(32))
    bus.publish(ROLLOUTS, stranger)  # a worker id nobody was issued a key for
    bus.publish(ROLLOUTS, rollout_for(task, ["1", "2"]))  # the honest one

    wait_for(lambda: bus.length(SCORED) == 1, "the honest rollout scored")
    letters = wait_for(lambda: bus.dead_letters() if len(bus.dead_letters()) == 3 else None, "three dead letters")
    assert all(letter.error.startswith("forged rollout: ") for letter in letters)
    errors = " | ".join(letter.error for letter in letters)
    assert "carries no producer_mac" in errors and "does not match the key of worker w-test" in errors
    assert "w-nobody, which holds no rollout key" in errors
    assert bus.redis.hget(keys.worker("w-test"), "num_rollouts_forged") == b"2"
    assert not bus.redis.exists(keys.worker("w-nobody"))  # no record is made up for an unknown id
    assert service.num_scored == 1 and service.producers.num_forged == 3
