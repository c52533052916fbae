"""The task accounting stays exact while the trusted services trim what they consumed (cluster/accounting.py,
shared/stream_trim.py): tasks issued = trained + dropped + dead-lettered (any stage) + pending, in total and
per worker, on a real Redis through the services' own write paths (benchmarks/stream_memory.py's pipeline:
the reward service's counted XADDs, the work API's Lua scripts, the learner's BatchCollector)."""

from __future__ import annotations

import time

import pytest
import redis

from benchmarks.stream_memory import Shape, SimulatedPipeline
from cluster.accounting import groups_of
from services.coordinator.work_leases import RETIRED, WorkLeases, refusal_letters
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.streams import DEAD, ROLLOUTS, SCORED, TASKS
from shared.work_api import SubmittedGroup
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def test_every_task_is_accounted_for_in_total_and_per_worker_while_streams_are_trimmed(
    redis_client: redis.Redis, keys: RunKeys
) -> None:
    shape = Shape(groups_per_step=4, group_size=2, max_new_tokens=2, prompt_tokens=4)
    pipeline = SimulatedPipeline(redis_client, shape, num_workers=2, run_id=keys.run_id)
    for trimmer in (pipeline.reward_trimmer, pipeline.collector.trimmer):
        trimmer.interval_s = 0.3  # every third step of simulated time
    for _ in range(20):
        pipeline.step()

    # a worker reports a task it cannot serve; one answers a lease twice (a second, different answer is refused)
    work = pipeline.work
    pipeline.issue_tasks()
    (failing,) = work.lease("w-0", 1, time.time())
    assert work.fail("w-0", failing.lease_id, "engine error", time.time()) == RETIRED  # w-0 has earned its leases
    (answered,) = work.lease("w-1", 1, time.time())
    group = SubmittedGroup(lease_id=answered.lease_id, group=pipeline.rollout(answered.task, "w-1").encode())
    assert work.submit("w-1", [group]).accepted == [answered.lease_id]
    assert work.submit("w-1", [group]).accepted == [answered.lease_id]  # the same bytes again: a retry, accepted once
    second = SubmittedGroup(lease_id=answered.lease_id, group=pipeline.rollout(answered.task, "w-1").encode())
    assert work.submit("w-1", [second]).refused  # another answer: already answered

    # a slow worker's leases expire and go to another worker, which answers them
    redis_client.hset(keys.worker("w-slow"), mapping={"state": "active"})
    redis_client.zadd(keys.worker_leases, {"w-slow": time.time() + 10**9})
    short = WorkLeases(redis_client, keys, lease_ms=1)
    slow = short.lease("w-slow", 2, time.time())
    assert len(slow) == 2
    taken = wait_for(lambda: short.lease("w-0", 2, time.time()), "the slow worker's leases reissued")
    assert {task.lease_id for task in taken} == {task.lease_id for task in slow}
    work.submit(
        "w-0", [SubmittedGroup(lease_id=t.lease_id, group=pipeline.rollout(t.task, "w-0").encode()) for t in taken]
    )

    # the reward service dead-letters a rollout it cannot score; the learner drops stale groups
    reward = pipeline.reward
    (forged,) = reward.read(ROLLOUTS, "reward-0", count=1, block_ms=1)
    reward.dead_letter(forged, "forged: mac mismatch")
    pipeline.score()
    pipeline.version += 10  # everything scored so far is now too stale to train
    pipeline.learn()
    pipeline.issue_tasks()  # and tasks left unleased, leases left held, groups left pending
    work.lease("w-1", 3, time.time())
    for trimmer in (pipeline.reward_trimmer, pipeline.collector.trimmer):
        trimmer.trim()

    accounting = groups_of(StreamBus(redis_client, keys, service="accounting"))
    summary = accounting.summary()
    assert accounting.num_unaccounted == 0, summary
    assert set(accounting.unaccounted_by_stage.values()) == {0}, summary
    assert accounting.num_unaccounted_workers == 0, summary
    assert accounting.num_trained == pipeline.num_trained == 20 * 4
    assert accounting.num_dropped.get("stale", 0) > 0
    assert (accounting.num_failed, accounting.num_dead_lettered_work) == (1, 1)
    assert (accounting.num_dead_lettered_reward, accounting.num_dead_lettered_learner) == (1, 0)
    assert accounting.num_refused == 1 and accounting.num_expired == 2
    assert accounting.num_held == 3 and accounting.num_unleased > 0
    workers = {row.worker_id: row for row in accounting.workers}
    assert workers["w-slow"].expired == 2 and workers["w-slow"].held == 0
    assert workers["w-1"].held == 3
    # and the streams were trimmed meanwhile: the counts did not come from their lengths
    for stream in (TASKS, ROLLOUTS, SCORED):
        assert reward.length(stream) < accounting.streams[stream.name].num_added / 2, stream.name
    assert reward.length(DEAD) == 2  # failed task, forged rollout (a refused answer is in its credential's refusals)
    assert len(refusal_letters(redis_client, keys, "")) == 1


def test_trimming_keeps_every_entry_some_group_has_not_finished(bus: StreamBus) -> None:
    for stream in (TASKS, SCORED):
        bus.ensure_group(stream)
    ids = [bus.publish_raw(TASKS, b"x") for _ in range(300)]
    assert bus.trim_consumed(TASKS) == 0  # nothing delivered yet
    bus.redis.xreadgroup("rollout", "w-0", {bus.keys.name_of(TASKS): ">"}, count=250)
    bus.ack(TASKS, ids[:120] + ids[150:250])  # ids[120:150] still pending (leases held)
    removed = bus.trim_consumed(TASKS)
    assert 0 < removed <= 120
    remaining = [entry_id.decode() for entry_id, _ in bus.redis.xrange(bus.keys.name_of(TASKS))]
    assert set(ids[120:]) <= set(remaining)  # the pending ones and the undelivered ones all stayed
    assert bus.redis.xpending(bus.keys.name_of(TASKS), "rollout")["pending"] == 30
    assert bus.trim_consumed(SCORED) == 0  # an empty stream, and a group-less one refuses to be trimmed blind
    with pytest.raises(ValueError):
        bus.trim_consumed(DEAD)


def test_a_dead_letter_counts_once_for_its_stream_even_when_retried(bus: StreamBus) -> None:
    bus.ensure_group(ROLLOUTS)
    bus.publish_raw(ROLLOUTS, b"\xffnot a group")
    assert bus.read(ROLLOUTS, "reward-0", count=1, block_ms=1) == []  # undecodable: dead-lettered on read
    entry_id = bus.redis.xrange(bus.keys.name_of(ROLLOUTS))[0][0].decode()
    bus._dead_letter_raw(bus.keys.name_of(ROLLOUTS), "reward", entry_id, b"", "retried after a lost reply", 1)
    assert bus.counts(bus.keys.dead_letter_counts) == {"rollouts": 1}
    assert bus.length(DEAD) == 2  # the letter itself may repeat; the count does not


def test_a_stream_that_fell_behind_is_trimmed_whole_not_one_batch_per_call(bus: StreamBus) -> None:
    bus.ensure_group(SCORED)
    name = bus.keys.name_of(SCORED)
    with bus.redis.pipeline(transaction=False) as pipe:
        for _ in range(25_000):
            pipe.xadd(name, {b"data": b"x"})
        pipe.execute()
    bus.redis.xreadgroup("learner", "learner-0", {name: ">"}, count=25_000)
    ids = [entry_id for entry_id, _ in bus.redis.xrange(name)]
    bus.redis.xack(name, "learner", *ids)
    assert bus.trim_consumed(SCORED) > 24_000  # one approximate XTRIM stops at 10,000
    assert bus.length(SCORED) < 1_000
