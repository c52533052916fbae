"""The admission rule on the real `scored` stream: at version t only groups with 0 <= t - v <= S are
admitted (and stay pending until checkpointed); every other group is counted by reason and acked,
broken ones are dead-lettered; after a restart the pending ones are decided again at the new t."""

from __future__ import annotations

import pytest
import redis

from services.learner.batch import BatchCollector
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.messages import FlatGroups, RolloutGroup, ScoredGroup, pack_float32, pack_int32
from shared.staleness import AdmissionRule
from shared.streams import SCORED

pytestmark = pytest.mark.integration


class LosesOneReply:
    """The real bus, except that the first read which gets entries loses its reply, as a connection
    dropped mid-answer would: Redis has marked them delivered, the consumer never saw them."""

    def __init__(self, bus: StreamBus) -> None:
        self.bus = bus
        self.num_lost = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.bus, name)

    def read(self, *args: object, **kwargs: object) -> list:
        deliveries = self.bus.read(*args, **kwargs)
        if deliveries and not self.num_lost:
            self.num_lost = len(deliveries)
            raise redis.ConnectionError("connection dropped before the reply arrived")
        return deliveries


def scored(run_id: str, policy_version: int, *, completion: tuple[int, ...] = (5, 1)) -> ScoredGroup:
    rollout = RolloutGroup(
        run_id=run_id,
        group_id=f"g-v{policy_version}",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="3+4=",
        worker_id="w",
        policy_version=policy_version,
        temperature=1.0,
        prompt_token_ids=pack_int32([7, 3, 8, 14]),
        completion_token_ids=pack_int32(completion),
        completion_lengths=pack_int32([len(completion)]),
        behaviour_logprobs=pack_float32([-1.0] * len(completion)),
        completion_texts=["1"],
        finish_reasons=["stop"],
        generation_s=0.0,
    )
    return ScoredGroup(run_id=run_id, rollout=rollout, rewards=[1.0])


def scored_with_rewards(run_id: str, policy_version: int, rewards: list[float]) -> ScoredGroup:
    """A group of len(rewards) one-token samples scored `rewards`."""
    group = scored(run_id, policy_version, completion=(5,))
    num_samples = len(rewards)
    rollout = group.rollout.model_copy(
        update={
            "group_id": f"g-v{policy_version}-{rewards}",
            "completion_token_ids": pack_int32([5] * num_samples),
            "completion_lengths": pack_int32([1] * num_samples),
            "behaviour_logprobs": pack_float32([-1.0] * num_samples),
            "completion_texts": ["1"] * num_samples,
            "finish_reasons": ["stop"] * num_samples,
        }
    )
    return ScoredGroup(run_id=run_id, rollout=rollout, rewards=rewards)


def make_collector(
    bus: StreamBus | LosesOneReply,
    keys: RunKeys,
    staleness_bound: int,
    groups_per_step: int,
    *,
    dynamic_sampling: bool = False,
    admission: AdmissionRule = "per_token",
) -> BatchCollector:
    collector = BatchCollector(
        bus,
        keys,
        staleness_bound=staleness_bound,
        groups_per_step=groups_per_step,
        vocab_size=16,
        max_positions=32,
        scored_block_ms=50,
        dynamic_sampling=dynamic_sampling,
        admission=admission,
    )
    collector.ensure_group()
    return collector


def pending_ids(bus: StreamBus, keys: RunKeys) -> list[str]:
    return [
        entry["message_id"].decode()
        for entry in bus.redis.xpending_range(keys.name_of(SCORED), SCORED.group, "-", "+", 100)
    ]


def test_mixed_versions_only_lags_within_the_bound_are_admitted_and_drops_are_counted(
    bus: StreamBus, keys: RunKeys
) -> None:
    collector = make_collector(bus, keys, staleness_bound=2, groups_per_step=3)
    for group in [
        scored(keys.run_id, 0),
        scored(keys.run_id, 5),
        scored(keys.run_id, 2),
        scored(keys.run_id, 7),
        scored("another-run", 5),
        scored(keys.run_id, 4, completion=(5, 99)),
        scored(keys.run_id, 4),
        scored(keys.run_id, 3),
        scored(keys.run_id, 5),  # the last one is never read: the batch is full
    ]:
        bus.publish(SCORED, group)

    batch = collector.collect(learner_version=5, should_stop=lambda: False)

    assert batch is not None
    assert [(a.group.rollout.policy_version, a.staleness) for a in batch.groups] == [(5, 0), (4, 1), (3, 2)]
    assert dict(collector.num_dropped) == {"stale": 2, "future_version": 1, "run_mismatch": 1}
    assert collector.num_dead_lettered == 1
    (letter,) = bus.dead_letters()
    assert "outside [0, 16)" in letter.error
    # Admitted groups stay pending (acked after the checkpoint); everything decided otherwise is acked.
    assert pending_ids(bus, keys) == batch.message_ids
    assert bus.group_progress(SCORED) == (1, 3)


def test_a_stale_mixed_version_group_is_dropped_whole_and_its_tokens_are_counted_by_their_own_lag(
    bus: StreamBus, keys: RunKeys
) -> None:
    """The oldest-token rule drops the whole group; the collector counts its tokens by lag, so a run shows
    how many of them (lag <= S) a per-token rule would have trained."""
    collector = make_collector(bus, keys, staleness_bound=1, groups_per_step=1, admission="oldest_token")
    group = scored(keys.run_id, 2, completion=(5, 1, 3))
    # one sample: token 0 from v2, tokens 1-2 from v4 (a version landed while it decoded)
    mixed = group.rollout.model_copy(update={"group_id": "g-mixed", "version_changes": pack_int32([0, 1, 4])})
    bus.publish(SCORED, ScoredGroup(run_id=keys.run_id, rollout=mixed, rewards=[1.0]))
    bus.publish(SCORED, scored(keys.run_id, 4))

    batch = collector.collect(learner_version=4, should_stop=lambda: False)

    assert batch is not None and [a.group.rollout.policy_version for a in batch.groups] == [4]
    assert dict(collector.num_dropped) == {"stale": 1}
    assert dict(collector.stale_token_lags) == {2: 1, 0: 2}


def test_per_token_admission_keeps_a_mixed_group_while_its_newest_token_is_fresh_and_counts_the_masked(
    bus: StreamBus, keys: RunKeys
) -> None:
    collector = make_collector(bus, keys, staleness_bound=1, groups_per_step=1)
    group = scored(keys.run_id, 2, completion=(5, 1, 3))
    mixed = group.rollout.model_copy(update={"group_id": "g-mixed", "version_changes": pack_int32([0, 1, 4])})
    bus.publish(SCORED, ScoredGroup(run_id=keys.run_id, rollout=mixed, rewards=[1.0]))

    batch = collector.collect(learner_version=4, should_stop=lambda: False)

    assert batch is not None and [a.group.rollout.group_id for a in batch.groups] == ["g-mixed"]
    assert batch.groups[0].staleness == 2  # the group's lag is still its oldest token's
    assert not collector.num_dropped
    collector.note_masked(batch.groups, learner_version=4)
    assert dict(collector.stale_token_lags) == {2: 1}  # the v2 token, masked out of the loss


def test_after_a_restart_pending_groups_come_first_and_are_decided_again_at_the_restored_version(
    bus: StreamBus, keys: RunKeys
) -> None:
    first = make_collector(bus, keys, staleness_bound=1, groups_per_step=3)
    for version in (2, 3, 3):
        bus.publish(SCORED, scored(keys.run_id, version))
    assert first.collect(learner_version=3, should_stop=lambda: False) is not None  # then the learner "dies"
    bus.publish(SCORED, scored(keys.run_id, 4))
    bus.publish(SCORED, scored(keys.run_id, 4))

    restarted = make_collector(bus, keys, staleness_bound=1, groups_per_step=3)
    assert restarted.load_own_pending() == 3
    batch = restarted.collect(learner_version=4, should_stop=lambda: False)

    assert batch is not None
    assert [(a.group.rollout.policy_version, a.replayed) for a in batch.groups] == [(3, True), (3, True), (4, False)]
    assert dict(restarted.num_dropped) == {"stale": 1}  # v2 was admissible at t=3, not at t=4


def test_collect_gives_up_when_asked_to_stop_and_leaves_the_partial_batch_pending(
    bus: StreamBus, keys: RunKeys
) -> None:
    collector = make_collector(bus, keys, staleness_bound=0, groups_per_step=4)
    bus.publish(SCORED, scored(keys.run_id, 0))
    polls = iter([False, False, True])
    assert collector.collect(learner_version=0, should_stop=lambda: next(polls)) is None
    assert len(pending_ids(bus, keys)) == 1


def test_groups_whose_read_reply_was_lost_are_recovered_without_a_restart(bus: StreamBus, keys: RunKeys) -> None:
    flaky = LosesOneReply(bus)
    collector = make_collector(flaky, keys, staleness_bound=1, groups_per_step=3)
    for _ in range(3):
        bus.publish(SCORED, scored(keys.run_id, 0))

    batch = collector.collect(learner_version=0, should_stop=lambda: False)

    assert flaky.num_lost == 3
    assert batch is not None and [a.replayed for a in batch.groups] == [True, True, True]


def test_dynamic_sampling_skips_flat_groups_with_their_reason_and_collects_until_the_batch_is_full(
    bus: StreamBus, keys: RunKeys
) -> None:
    collector = make_collector(bus, keys, staleness_bound=1, groups_per_step=2, dynamic_sampling=True)
    spread, all_zero, all_one = [1.0, 0.0, 0.0, 0.0], [0.0] * 4, [1.0] * 4
    for version, rewards in [(0, all_zero), (0, spread), (0, all_one), (0, all_zero), (3, spread), (0, spread)]:
        bus.publish(SCORED, scored_with_rewards(keys.run_id, version, rewards))
    windows: list[FlatGroups] = []

    batch = collector.collect(learner_version=0, should_stop=lambda: False, on_window=windows.append)

    assert batch is not None
    assert [a.group.rewards for a in batch.groups] == [spread, spread]
    # the flat ones are dropped (acked at once, counted in Redis with the ack); the future one as before
    assert dict(collector.num_dropped) == {"zero_variance": 3, "future_version": 1}
    assert bus.counts(keys.learner_decisions) == {"zero_variance": 3, "future_version": 1}
    assert pending_ids(bus, keys) == batch.message_ids
    assert batch.flat_groups == FlatGroups(
        num_groups=5, num_flat_at_zero=2, num_flat_at_max=1, num_skipped=3, num_samples=20
    )
    assert batch.flat_groups.groups_per_trained_group == 2.5
    # the groups past the admission rule, a step's worth (2) at a time: the fifth waits for the next window
    assert [w.num_groups for w in windows] == [2, 2] and windows[0].num_flat_at_zero == 1
    # every group written is admitted (pending until its checkpoint), dropped with a reason, or dead-lettered
    num_decided = len(batch.groups) + sum(collector.num_dropped.values()) + collector.num_dead_lettered
    assert num_decided == bus.length(SCORED) == 6
    assert bus.backlog(SCORED) == len(batch.groups)  # only the admitted wait (for the checkpoint's ack)


def test_when_every_group_is_flat_the_batch_never_fills_but_each_steps_worth_is_reported(
    bus: StreamBus, keys: RunKeys
) -> None:
    collector = make_collector(bus, keys, staleness_bound=1, groups_per_step=2, dynamic_sampling=True)
    for _ in range(5):
        bus.publish(SCORED, scored_with_rewards(keys.run_id, 0, [0.0] * 4))
    windows: list[FlatGroups] = []

    batch = collector.collect(
        learner_version=0, should_stop=lambda: collector.num_dropped["zero_variance"] == 5, on_window=windows.append
    )

    assert batch is None  # stopped: nothing admissible came
    assert [(w.zero_variance_fraction, w.num_skipped) for w in windows] == [(1.0, 2), (1.0, 2)]
    assert bus.backlog(SCORED) == 0  # every flat group acked: none waits to be decided again


def test_without_dynamic_sampling_flat_groups_are_trained_and_counted(bus: StreamBus, keys: RunKeys) -> None:
    collector = make_collector(bus, keys, staleness_bound=1, groups_per_step=2)
    for rewards in ([0.0] * 4, [0.5] * 4):
        bus.publish(SCORED, scored_with_rewards(keys.run_id, 0, rewards))

    batch = collector.collect(learner_version=0, should_stop=lambda: False)

    assert batch is not None and len(batch.groups) == 2 and not collector.num_dropped
    assert (batch.flat_groups.num_flat_at_zero, batch.flat_groups.num_flat_other) == (1, 1)
    assert batch.flat_groups.zero_variance_fraction == 1.0 and batch.flat_groups.num_skipped == 0
