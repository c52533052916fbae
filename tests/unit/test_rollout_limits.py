"""What an answer may hold, and how it is decoded (shared/rollout_limits.py, shared/bounded_msgpack.py,
shared/work_api.py): the limits follow from the task (and so the run), the largest honest group and submission
of a run fit the limits derived for it, and every bomb shape is refused unbuilt, naming the limit it broke."""

from __future__ import annotations

import uuid

import msgpack
import pytest

from services.rollout.work_client import split_submissions
from shared.bounded_msgpack import DecodeLimitError, DecodeLimits, unpack_bounded
from shared.config import GRPOConfig, ModelConfig, RunConfig
from shared.messages import (
    EnvironmentSpec,
    MessageDecodeError,
    RolloutGroup,
    TaskGroup,
    pack_float32,
    pack_int32,
    pack_mask,
)
from shared.rollout_limits import (
    MAX_GROUP_BYTES,
    MAX_TEXT_BYTES_PER_TOKEN,
    TINY_RANDOM_TEXT_BYTES_PER_TOKEN,
    RolloutLimits,
    largest_group_bytes,
)
from shared.work_api import (
    MAX_GROUPS_PER_SUBMISSION,
    MAX_SUBMISSION_BYTES,
    MIN_SUBMISSION_BYTES,
    SUBMISSION_DECODE_LIMITS,
    SubmittedGroup,
    WorkSubmission,
    max_submission_bytes,
)

MIB = 1024 * 1024
LEASE_ID = f"{2**64 - 1}-{2**64 - 1}"  # the longest lease id


def task_of(num_samples: int = 2, max_new_tokens: int = 4, max_turns: int | None = None) -> TaskGroup:
    environment = None if max_turns is None else EnvironmentSpec(state="deal-7", max_turns=max_turns)
    return TaskGroup(
        run_id="r",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="1+2=",
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        environment=environment,
    )


def group_of(lengths: list[int], text: str = "x", prompt_tokens: int = 3, **fields: object) -> RolloutGroup:
    """A well-formed group for task_of(): samples of these lengths."""
    num_tokens = sum(lengths)
    values: dict[str, object] = dict(
        run_id="r",
        group_id="g",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="1+2=",
        worker_id="w",
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32(range(prompt_tokens)),
        completion_token_ids=pack_int32([5] * num_tokens),
        completion_lengths=pack_int32(lengths),
        behaviour_logprobs=pack_float32([-1.0] * num_tokens),
        completion_texts=[text] * len(lengths),
        finish_reasons=["length"] * len(lengths),
        generation_s=0.01,
    )
    return RolloutGroup(**(values | fields))


def answer(group: RolloutGroup | bytes, task: TaskGroup | None) -> RolloutGroup:
    payload = group if isinstance(group, bytes) else group.encode()
    return SubmittedGroup(lease_id="1-0", group=payload).decode_group(task)


# the derivation


def test_a_tasks_limits_follow_from_the_run_that_issued_it() -> None:
    single = RolloutLimits.for_task(task_of(num_samples=8, max_new_tokens=48))
    episodes = RolloutLimits.for_task(task_of(num_samples=8, max_new_tokens=6, max_turns=2))

    assert (single.num_samples, single.max_model_tokens_per_sample, single.multi_turn) == (8, 48, False)
    assert single.max_tokens_per_sample == 48  # every token of a single-turn sample is the model's
    assert (episodes.max_model_tokens_per_sample, episodes.multi_turn) == (12, True)  # max_turns x max_new_tokens
    assert episodes.max_tokens_per_sample == MAX_GROUP_BYTES // 4  # observations: only the group's bytes bound them
    limits = single.decode_limits
    assert (limits.max_depth, limits.max_array_len, limits.max_map_len) == (2, 8, len(RolloutGroup.model_fields))
    assert limits.max_items == len(RolloutGroup.model_fields) + 3 * 8  # three lists of one entry per sample
    assert limits.max_str_bytes == 48 * MAX_TEXT_BYTES_PER_TOKEN and limits.max_bin_bytes == MAX_GROUP_BYTES


def test_a_lease_without_a_readable_task_is_decoded_within_any_tasks_limits() -> None:
    ceiling = RolloutLimits.any_task()
    assert (ceiling.num_samples, ceiling.multi_turn) == (1024, True)  # TaskGroup's num_samples <= 1024
    assert ceiling.max_model_tokens_per_sample == 256 * 65536  # max_turns x max_new_tokens at their schema maxima


def test_the_body_limit_follows_the_run_between_its_floor_and_ceiling() -> None:
    demo = RunConfig(run_id="r", model=ModelConfig(init="tiny-random", max_position_embeddings=32))
    long_context = RunConfig(
        run_id="r",
        model=ModelConfig(init="tiny-random", max_position_embeddings=512),
        grpo=GRPOConfig(group_size=8),
    )
    unsized = RunConfig(run_id="r")  # a model folder or a catalog base: the run bounds no prompt nor observation

    assert max_submission_bytes(demo) == MIN_SUBMISSION_BYTES  # 64 groups of ~10 KB: the floor
    assert MIN_SUBMISSION_BYTES < max_submission_bytes(long_context) < MAX_SUBMISSION_BYTES
    assert largest_group_bytes(unsized) == MAX_GROUP_BYTES and max_submission_bytes(unsized) == MAX_SUBMISSION_BYTES


@pytest.mark.parametrize("context_tokens", [32, 96, 1024])
def test_the_largest_honest_submissions_of_a_tiny_random_run_fit_its_limits(context_tokens: int) -> None:
    """Every sample fills the context (one prompt token, the rest completion, a version change at every token,
    multi-turn masks), with the widest text per token; 64 such groups, split as the worker's client splits them."""
    run = RunConfig(run_id="r" * 64, model=ModelConfig(init="tiny-random", max_position_embeddings=context_tokens))
    completion_tokens = context_tokens - 1
    lengths = [completion_tokens] * run.grpo.group_size
    num_tokens = sum(lengths)
    changes = [
        v for sample in range(len(lengths)) for token in range(1, completion_tokens) for v in (sample, token, token)
    ]
    widest = "<eos>" + "\U0001d7d8" * (completion_tokens - 1)  # the character tokenizer's widest tokens
    assert len(widest.encode()) <= TINY_RANDOM_TEXT_BYTES_PER_TOKEN * completion_tokens
    group = group_of(
        lengths,
        text=widest,
        prompt_tokens=1,
        run_id=run.run_id,
        group_id=uuid.uuid4().hex * 2,
        task_id="t" * 64,
        worker_id="w" * 64,
        prompt="\U0001d7d8",
        producer_mac=b"m" * 32,
        completion_mask=pack_mask([1] * num_tokens),
        env_rewards=[0.5] * len(lengths),
        version_changes=pack_int32(changes),
    )
    answers = [SubmittedGroup(lease_id=LEASE_ID, group=group.encode())] * MAX_GROUPS_PER_SUBMISSION

    assert len(group.encode()) <= largest_group_bytes(run)
    for groups in split_submissions(answers):
        body = WorkSubmission(run_id=run.run_id, groups=groups).encode()
        assert len(body) <= max_submission_bytes(run)
        assert WorkSubmission.decode(body, SUBMISSION_DECODE_LIMITS).groups == groups


# the decoder


def test_a_bounded_decode_reads_what_msgpack_reads() -> None:
    values = {
        "a": 1,
        "b": [1, 2.5, None, True, False, -3, -100, 2**40, -(2**40), "x" * 40, b"y" * 300],
        "c": {"d": "é"},
    }
    limits = DecodeLimits(
        max_depth=2, max_items=20, max_array_len=11, max_map_len=3, max_str_bytes=64, max_bin_bytes=300
    )
    for value in (values, {}, [], 0, "s", b""):
        assert unpack_bounded(msgpack.packb(value, use_bin_type=True), limits) == value
    group = group_of([2, 2])
    assert RolloutGroup.decode(group.encode(), RolloutLimits.for_task(task_of()).decode_limits) == group


BOMB_BYTES = 16 * MIB - 8
BOMBS = {
    "one array of empty maps": (b"\xdd" + BOMB_BYTES.to_bytes(4, "big") + b"\x80" * BOMB_BYTES, "an array of"),
    "deep nesting": (b"\x91" * BOMB_BYTES + b"\xc0", "nested deeper than 3"),
    "a huge string": (b"\x81\xa6run_id\xdb" + BOMB_BYTES.to_bytes(4, "big") + b"r" * BOMB_BYTES, "a string of"),
    "a huge key": (b"\x81\xdb" + BOMB_BYTES.to_bytes(4, "big") + b"k" * BOMB_BYTES + b"\xc0", "a string of"),
    "a container as key": (b"\x81\x91\xc0\xc0", "is a container"),
    "many small arrays": (
        b"\x83\xa1a" + b"\x9f" + b"\x90" * 15 + b"\xa1b" + b"\x9f" * 16 + b"\xa1c\xc0",
        "items in all",
    ),
    "an ext type": (b"\xc7\x01\x05a", "starts no value"),
    "a truncated bin": (b"\xc6\x00\x10\x00\x00abc", "ends inside a value"),
}


@pytest.mark.parametrize("name", BOMBS)
def test_every_bomb_shape_is_refused_naming_its_limit(name: str) -> None:
    payload, reason = BOMBS[name]
    limits = SUBMISSION_DECODE_LIMITS if name != "many small arrays" else DecodeLimits(3, 40, 16, 3, 8, 8)
    with pytest.raises(DecodeLimitError, match=reason):
        unpack_bounded(payload, limits)


# a group checked against its task


def test_an_honest_group_is_decoded_as_sent() -> None:
    group = group_of([4, 1], text="abc")
    assert answer(group, task_of()) == group


@pytest.mark.parametrize(
    ("group", "reason"),
    [
        (group_of([1, 1, 1]), "an array of 3 entries, over the decode limit of 2"),
        (group_of([5, 1]), "sample 0 has 5 model tokens, over the task's max_new_tokens \\(4\\)"),
        (group_of([1, 1], text="t" * 4097), "a string of 4097 bytes, over the decode limit of 4096"),
        (group_of([1, 1], text="t" * 2048), "sample 0's text is 2048 bytes for 1 tokens"),
        (b"\xdd" + (MAX_GROUP_BYTES // 2).to_bytes(4, "big") + b"\x80" * (MAX_GROUP_BYTES // 2), "an array of"),
        (b"\x91" * MAX_GROUP_BYTES, "nested deeper than 2"),
    ],
    ids=["more samples", "longer samples", "a huge text", "a long text", "an array bomb", "deep nesting"],
)
def test_a_group_over_its_tasks_limits_is_refused_naming_them(group: RolloutGroup | bytes, reason: str) -> None:
    with pytest.raises(MessageDecodeError, match=reason):
        answer(group, task_of())


def test_a_multi_turn_sample_holds_observations_but_only_max_turns_of_model_turns() -> None:
    task = task_of(num_samples=1, max_new_tokens=4, max_turns=2)
    honest = [1] * 4 + [0] * 100 + [1] * 4  # two full turns and a long observation between them
    over = [1] * 4 + [0] * 100 + [1] * 5

    def episode(mask: list[int]) -> RolloutGroup:
        logprobs = [-1.0 if flag else 0.0 for flag in mask]
        return group_of([len(mask)], behaviour_logprobs=pack_float32(logprobs), completion_mask=pack_mask(mask))

    played = episode(honest)
    assert answer(played, task) == played
    with pytest.raises(MessageDecodeError, match="9 model tokens, over the task's max_turns x max_new_tokens \\(8\\)"):
        answer(episode(over), task)
