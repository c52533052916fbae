import msgpack
import numpy as np
import pytest

from shared.api import LearnerInfo
from shared.messages import (
    DeadLetter,
    FlatGroups,
    LearnerHeadline,
    LearnerState,
    MessageDecodeError,
    RolloutGroup,
    ScoredGroup,
    TaskGroup,
    WeightsPublished,
    pack_float32,
    pack_int32,
)

LEARNER_STATE = LearnerState(
    run_id="r", status="training", learner_version=3, published_version=3, staleness_bound=2, num_steps_target=10
)


def make_rollout(**overrides) -> RolloutGroup:
    fields = dict(
        run_id="r",
        group_id="g",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="1+2=",
        worker_id="w",
        policy_version=3,
        temperature=1.0,
        prompt_token_ids=pack_int32([4, 3, 5, 14]),
        completion_token_ids=pack_int32([7, 1, 7, 7]),
        completion_lengths=pack_int32([2, 2]),
        behaviour_logprobs=pack_float32([-0.5, -0.1, -2.0, -3.0]),
        completion_texts=["3", "33"],
        finish_reasons=["stop", "length"],
        generation_s=0.01,
    )
    fields.update(overrides)
    return RolloutGroup(**fields)


def test_scored_group_round_trips_with_its_arrays() -> None:
    scored = ScoredGroup(run_id="r", rollout=make_rollout(), rewards=[1.0, 0.5])
    decoded = ScoredGroup.decode(scored.encode())
    assert decoded == scored
    tokens = decoded.rollout.sample_tokens()
    logprobs = decoded.rollout.sample_logprobs()
    assert [t.tolist() for t in tokens] == [[7, 1], [7, 7]]
    np.testing.assert_allclose(np.concatenate(logprobs), [-0.5, -0.1, -2.0, -3.0])
    assert decoded.rollout.num_samples == 2


@pytest.mark.parametrize(
    "message",
    [
        TaskGroup(
            run_id="r", task_id="t", task_name="x", prompt="1+1=", num_samples=8, max_new_tokens=2, temperature=1.0
        ),
        WeightsPublished(
            run_id="r",
            policy_version=0,
            manifest_url="http://h/v1/weights/0/manifest",
            manifest_sha256="a" * 64,
            total_size_bytes=10,
            num_chunks=1,
        ),
        DeadLetter(
            run_id="r",
            source_stream="s",
            source_message_id="1-0",
            consumer_group="g",
            service="x",
            error="e",
            payload=b"\x00",
            num_deliveries=1,
        ),
        LEARNER_STATE,
    ],
)
def test_every_message_type_round_trips(message) -> None:
    assert type(message).decode(message.encode()) == message


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb([1, 2]), "expected a map"),
        (msgpack.packb({"run_id": "r"}), "task_id: Field required"),
        (
            msgpack.packb(
                {
                    "run_id": "r",
                    "task_id": "t",
                    "task_name": "x",
                    "prompt": "p",
                    "num_samples": "8",
                    "max_new_tokens": 2,
                    "temperature": 1.0,
                }
            ),
            "num_samples",
        ),
        (
            msgpack.packb(
                {
                    "run_id": "r",
                    "task_id": "t",
                    "task_name": "x",
                    "prompt": "p",
                    "num_samples": 0,
                    "max_new_tokens": 2,
                    "temperature": 1.0,
                }
            ),
            "num_samples",
        ),
        (
            msgpack.packb(
                {
                    "schema_version": 2,
                    "run_id": "r",
                    "task_id": "t",
                    "task_name": "x",
                    "prompt": "p",
                    "num_samples": 8,
                    "max_new_tokens": 2,
                    "temperature": 1.0,
                }
            ),
            "schema_version",
        ),
        (
            msgpack.packb(
                {
                    "run_id": "r",
                    "task_id": "t",
                    "task_name": "x",
                    "prompt": "p",
                    "num_samples": 8,
                    "max_new_tokens": 2,
                    "temperature": 1.0,
                    "admin": True,
                }
            ),
            "admin",
        ),
    ],
)
def test_malformed_task_payloads_are_rejected_with_the_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(MessageDecodeError, match=reason):
        TaskGroup.decode(payload)


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"completion_lengths": pack_int32([2, 1])}, "sum to 3 but there are 4 tokens"),
        ({"behaviour_logprobs": pack_float32([-1.0])}, "1 behaviour logprobs for 4 tokens"),
        ({"completion_texts": ["3"]}, "2 samples but 1 texts"),
        ({"prompt_token_ids": b"\x00\x01\x02"}, "not a multiple of 4"),
        ({"completion_lengths": b"", "completion_token_ids": b"", "behaviour_logprobs": b""}, "at least one sample"),
        ({"finish_reasons": ["stop", "exploded"]}, "finish_reasons"),
        ({"policy_version": -1}, "policy_version"),
    ],
)
def test_rollout_groups_whose_arrays_disagree_are_rejected(overrides, reason) -> None:
    payload = msgpack.packb({**make_rollout().model_dump(), **overrides}, use_bin_type=True)
    with pytest.raises(MessageDecodeError, match=reason):
        RolloutGroup.decode(payload)


def test_scored_group_needs_one_reward_per_sample_and_one_run() -> None:
    payload = ScoredGroup(run_id="r", rollout=make_rollout(), rewards=[1.0, 0.0]).model_dump()
    with pytest.raises(MessageDecodeError, match="1 rewards for 2 samples"):
        ScoredGroup.decode(msgpack.packb({**payload, "rewards": [1.0]}, use_bin_type=True))
    with pytest.raises(MessageDecodeError, match="differs"):
        ScoredGroup.decode(msgpack.packb({**payload, "run_id": "other"}, use_bin_type=True))


def test_an_announcement_from_a_learner_that_does_not_stamp_its_publication_start_still_decodes() -> None:
    new = WeightsPublished(
        run_id="r",
        policy_version=4,
        manifest_url="http://h/v1/weights/4/manifest",
        manifest_sha256="a" * 64,
        total_size_bytes=10,
        num_chunks=1,
        published_at_s=100.5,
        publish_started_at_s=100.0,
    )
    assert WeightsPublished.decode(new.encode()).publish_started_at_s == 100.0
    old = new.model_dump(mode="python")
    del old["publish_started_at_s"]
    decoded = WeightsPublished.decode(msgpack.packb(old, use_bin_type=True))
    assert (decoded.publish_started_at_s, decoded.published_at_s) == (0.0, 100.5)  # 0.0: unknown


def test_version_changes_say_which_version_sampled_each_token() -> None:
    # sample 0 saw version 5 land after its first token; sample 1 ran on version 3 throughout
    rollout = make_rollout(version_changes=pack_int32([0, 1, 5]))
    decoded = RolloutGroup.decode(rollout.encode())
    assert decoded.token_versions().tolist() == [3, 5, 3, 3]
    assert (decoded.policy_version, decoded.newest_version) == (3, 5)
    assert make_rollout().token_versions().tolist() == [3, 3, 3, 3]
    # a sample that started on a newer version, and two changes in one sample
    three = make_rollout(
        completion_token_ids=pack_int32([7, 1, 7, 7, 1, 1]),
        completion_lengths=pack_int32([2, 4]),
        behaviour_logprobs=pack_float32([-0.5] * 6),
        version_changes=pack_int32([1, 0, 4, 1, 2, 6]),
    )
    assert three.token_versions().tolist() == [3, 3, 4, 4, 6, 6]
    assert three.newest_version == 6


@pytest.mark.parametrize(
    "changes, message",
    [
        ([0, 1], "int32 triples"),
        ([2, 0, 5], "sample the group does not have"),
        ([0, 2, 5], "past its sample's end"),
        ([0, 1, 3], "newer than policy_version"),
        ([1, 1, 5, 0, 1, 5], "sorted"),
        ([0, 0, 5, 0, 1, 4], "later tokens and newer versions"),
        ([0, 0, 5, 1, 0, 4], "not the oldest"),
    ],
)
def test_version_changes_that_contradict_the_group_are_refused(changes: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_rollout(version_changes=pack_int32(changes))


def test_the_status_shows_the_learner_states_headline_fields_as_they_are() -> None:
    flat = FlatGroups(num_groups=8, num_flat_at_zero=8)
    shown = {"num_dropped": {"stale": 4}, "busy_fraction": 0.5, "last_flat_groups": flat, "zero_variance_warning": "x"}
    state = LEARNER_STATE.model_copy(update={**shown, "num_steps_done": 3})  # and one field the status leaves out
    info = LearnerInfo.of(state)
    assert info.model_dump() == state.model_dump(include=set(LearnerHeadline.model_fields))
    assert set(LearnerInfo.model_fields) == set(LearnerHeadline.model_fields) < set(LearnerState.model_fields)
    assert LearnerInfo.model_validate_json(info.model_dump_json()) == info  # as a client reads GET /v1/status
