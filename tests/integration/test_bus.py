"""The stream bus against a real redis-server: delivery, ack, claiming after a consumer dies, dead letters."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from shared.bus import StreamBus, UndecodableEntryError, connect
from shared.keys import RunKeys
from shared.messages import LearnerState, MessageDecodeError, TaskGroup, WeightsPublished
from shared.streams import LEARNER_STATE, ROLLOUTS, TASKS, WEIGHTS

pytestmark = pytest.mark.integration


def make_task(run_id: str, index: int) -> TaskGroup:
    return TaskGroup(
        run_id=run_id,
        task_id=f"t{index}",
        task_name="arithmetic_mod10",
        prompt=f"{index % 10}+1=",
        num_samples=4,
        max_new_tokens=2,
        temperature=1.0,
    )


def test_published_messages_arrive_typed_and_leave_pending_until_acked(bus: StreamBus, keys: RunKeys) -> None:
    bus.ensure_group(TASKS)
    sent = [make_task(keys.run_id, i) for i in range(3)]
    for task in sent:
        bus.publish(TASKS, task)

    deliveries = bus.read(TASKS, "w1", count=10, block_ms=100)

    assert [d.message for d in deliveries] == sent
    assert bus.backlog(TASKS) == 3  # delivered but not acked: still pending
    assert bus.ack(TASKS, [d.message_id for d in deliveries]) == 3
    assert bus.backlog(TASKS) == 0


def test_group_created_after_publishing_still_sees_earlier_messages(bus: StreamBus, keys: RunKeys) -> None:
    bus.publish(TASKS, make_task(keys.run_id, 0))
    bus.ensure_group(TASKS)
    bus.ensure_group(TASKS)  # idempotent
    assert len(bus.read(TASKS, "w1", count=10, block_ms=100)) == 1


def _consume_without_ack_then_die(redis_url: str, run_id: str) -> None:
    keys = RunKeys(run_id)
    bus = StreamBus(connect(redis_url), keys, service="doomed")
    deliveries = bus.read(TASKS, "doomed", count=10, block_ms=1000)
    assert len(deliveries) == 2
    os.kill(os.getpid(), signal.SIGKILL)  # dies before acking, as a crashed worker would


def test_messages_of_a_consumer_killed_before_ack_are_claimed_and_processed_once_more(
    bus: StreamBus, keys: RunKeys, redis_server
) -> None:
    bus.ensure_group(TASKS)
    for i in range(2):
        bus.publish(TASKS, make_task(keys.run_id, i))
    doomed = multiprocessing.get_context("spawn").Process(
        target=_consume_without_ack_then_die, args=(redis_server.url, keys.run_id)
    )
    doomed.start()
    doomed.join(timeout=60)
    assert doomed.exitcode == -signal.SIGKILL

    assert bus.read(TASKS, "survivor", count=10, block_ms=100) == []  # nothing new
    claimed = bus.claim_stale(TASKS, "survivor", min_idle_ms=0)

    assert sorted(d.message.task_id for d in claimed) == ["t0", "t1"]
    assert [d.num_deliveries for d in claimed] == [2, 2]
    bus.ack(TASKS, [d.message_id for d in claimed])
    assert bus.backlog(TASKS) == 0
    assert bus.claim_stale(TASKS, "survivor", min_idle_ms=0) == []


def test_poison_message_goes_to_dead_letter_and_the_rest_still_flow(bus: StreamBus, keys: RunKeys) -> None:
    bus.ensure_group(TASKS)
    bus.publish(TASKS, make_task(keys.run_id, 0))
    poison_id = bus.publish_raw(TASKS, b"\xc1 definitely not msgpack")
    bus.publish(TASKS, make_task(keys.run_id, 2))

    deliveries = bus.read(TASKS, "w1", count=10, block_ms=100)

    assert [d.message.task_id for d in deliveries] == ["t0", "t2"]
    letters = bus.dead_letters()
    assert len(letters) == 1
    assert letters[0].source_message_id == poison_id
    assert "not msgpack" in letters[0].error
    assert letters[0].payload == b"\xc1 definitely not msgpack"
    bus.ack(TASKS, [d.message_id for d in deliveries])
    assert bus.backlog(TASKS) == 0  # the poison entry was acked with its dead letter


def test_wrong_schema_is_dead_lettered_with_the_field_that_failed(bus: StreamBus, keys: RunKeys) -> None:
    import msgpack

    bus.ensure_group(TASKS)
    bus.publish_raw(TASKS, msgpack.packb({"schema_version": 1, "run_id": keys.run_id, "task_id": 7}))
    assert bus.read(TASKS, "w1", count=10, block_ms=100) == []
    (letter,) = bus.dead_letters()
    assert "task_id" in letter.error and "prompt" in letter.error


def test_message_that_keeps_failing_is_dead_lettered_after_max_deliveries(bus: StreamBus, keys: RunKeys) -> None:
    bus.ensure_group(TASKS)
    bus.publish(TASKS, make_task(keys.run_id, 0))
    assert len(bus.read(TASKS, "w1", count=1, block_ms=100)) == 1
    for attempt in range(2, bus.max_deliveries + 1):  # each consumer "crashes" while processing it
        (again,) = bus.claim_stale(TASKS, f"w{attempt}", min_idle_ms=0)
        assert again.num_deliveries == attempt
    assert bus.claim_stale(TASKS, "last", min_idle_ms=0) == []
    (letter,) = bus.dead_letters()
    assert "delivered" in letter.error
    assert bus.backlog(TASKS) == 0


def test_dead_letter_after_processing_failure_keeps_the_message(bus: StreamBus, keys: RunKeys) -> None:
    bus.ensure_group(TASKS)
    task = make_task(keys.run_id, 0)
    bus.publish(TASKS, task)
    (delivery,) = bus.read(TASKS, "w1", count=1, block_ms=100)
    bus.dead_letter(delivery, "verifier raised ZeroDivisionError")
    (letter,) = bus.dead_letters()
    assert TaskGroup.decode(letter.payload) == task
    assert bus.backlog(TASKS) == 0


def test_restarted_consumer_rereads_its_own_pending(bus: StreamBus, keys: RunKeys) -> None:
    bus.ensure_group(TASKS)
    bus.publish(TASKS, make_task(keys.run_id, 0))
    assert len(bus.read(TASKS, "learner-0", block_ms=100)) == 1
    (pending,) = bus.read_own_pending(TASKS, "learner-0")
    assert pending.message.task_id == "t0"


def test_publish_and_ack_writes_results_and_acks_inputs_together(bus: StreamBus, keys: RunKeys) -> None:
    bus.ensure_group(TASKS)
    for i in range(3):
        bus.publish(TASKS, make_task(keys.run_id, i))
    deliveries = bus.read(TASKS, "w1", count=3, block_ms=100)
    bus.publish_and_ack(ROLLOUTS, [d.message for d in deliveries[:2]], deliveries[:2])
    assert bus.length(ROLLOUTS) == 2
    assert bus.backlog(TASKS) == 1  # the third is still pending


def announcement(run_id: str, version: int) -> WeightsPublished:
    return WeightsPublished(
        run_id=run_id,
        policy_version=version,
        manifest_url=f"http://learner:8000/v1/weights/{version}/manifest",
        manifest_sha256=f"{version:064x}",
        total_size_bytes=1024,
        num_chunks=1,
    )


def test_latest_and_entries_read_a_stream_without_a_group(bus: StreamBus, keys: RunKeys) -> None:
    assert bus.latest(WEIGHTS) is None and bus.latest_entry(WEIGHTS) is None and bus.entries(WEIGHTS) == []
    sent = [announcement(keys.run_id, version) for version in range(3)]
    entry_ids = [bus.publish(WEIGHTS, message) for message in sent]

    assert bus.latest(WEIGHTS) == sent[-1]
    newest = bus.latest_entry(WEIGHTS)
    assert newest is not None and (newest.entry_id, newest.message) == (entry_ids[-1], sent[-1])
    assert bus.entries(WEIGHTS) == sent  # oldest first
    assert bus.entries(WEIGHTS, count=2) == sent[:2]
    assert bus.length(WEIGHTS) == 3  # reading without a group consumes nothing


def test_undecodable_newest_entry_names_its_id(bus: StreamBus, keys: RunKeys) -> None:
    bus.publish(WEIGHTS, announcement(keys.run_id, 0))
    bad_id = bus.publish_raw(WEIGHTS, b"\xc1 not msgpack")
    with pytest.raises(UndecodableEntryError) as raised:
        bus.latest_entry(WEIGHTS)
    assert raised.value.entry_id == bad_id
    with pytest.raises(MessageDecodeError):
        bus.latest(WEIGHTS)
    assert bus.dead_letters() == []  # no group to ack for: nothing is dead-lettered


def test_wait_for_entries_returns_once_an_entry_past_the_given_id_exists(bus: StreamBus, keys: RunKeys) -> None:
    assert bus.wait_for_entries(WEIGHTS, after_id="0-0", block_ms=50) is False  # empty: waits out the block
    first_id = bus.publish(WEIGHTS, announcement(keys.run_id, 0))
    assert bus.wait_for_entries(WEIGHTS, after_id="0-0", block_ms=50) is True
    assert bus.wait_for_entries(WEIGHTS, after_id=first_id, block_ms=50) is False
    bus.publish(WEIGHTS, announcement(keys.run_id, 1))
    assert bus.wait_for_entries(WEIGHTS, after_id=first_id, block_ms=50) is True


def test_state_key_holds_the_last_value_put(bus: StreamBus, keys: RunKeys, redis_client) -> None:
    assert bus.get_state(LEARNER_STATE) is None
    states = [
        LearnerState(
            run_id=keys.run_id,
            status=status,
            learner_version=version,
            published_version=version - 1,
            staleness_bound=2,
            num_steps_target=10,
        )
        for version, status in [(0, "starting"), (3, "training")]
    ]
    for state in states:
        bus.put_state(LEARNER_STATE, state)
    assert bus.get_state(LEARNER_STATE) == states[-1]
    assert redis_client.exists(keys.name_of(LEARNER_STATE))  # one key under the run prefix
    redis_client.set(keys.name_of(LEARNER_STATE), b"\xc1")
    with pytest.raises(MessageDecodeError):
        bus.get_state(LEARNER_STATE)


def test_group_operations_refuse_a_stream_read_without_a_group(bus: StreamBus) -> None:
    with pytest.raises(ValueError, match="without a consumer group"):
        bus.read(WEIGHTS, "w1", block_ms=10)
    with pytest.raises(ValueError, match="without a consumer group"):
        bus.ensure_group(WEIGHTS)


def test_ack_and_count_counts_an_entry_once_however_often_it_is_acked(bus: StreamBus, keys: RunKeys) -> None:
    bus.ensure_group(TASKS)
    for index in range(2):
        bus.publish(TASKS, make_task(keys.run_id, index))
    first, second = bus.read(TASKS, "c1", count=2, block_ms=100)
    counters = keys.learner_decisions
    assert bus.ack_and_count(TASKS, first.message_id, counters, "stale") == 1
    assert bus.ack_and_count(TASKS, first.message_id, counters, "stale") == 0  # a retry after a lost reply
    assert bus.ack_and_count(TASKS, second.message_id, counters, "future_version") == 1
    assert bus.counts(counters) == {"stale": 1, "future_version": 1}
    assert bus.group_progress(TASKS) == (0, 0)
    bus.put_counts(counters, {"stale": 5})
    assert bus.counts(counters) == {"stale": 5, "future_version": 1}
