"""Laying scored groups out as a training batch, and refusing groups the model cannot hold."""

from __future__ import annotations

import math

import pytest

from services.learner.batch import AdmittedGroup, InvalidGroupError, tensorize, token_lags, validate_group
from services.learner.grpo import ADVANTAGE_EPS
from shared.bus import Delivery
from shared.messages import RolloutGroup, ScoredGroup, pack_float32, pack_int32

PAD = 0


def scored_group(
    prompt: list[int],
    completions: list[list[int]],
    rewards: list[float],
    *,
    logprobs: list[float] | None = None,
    temperature: float = 1.0,
) -> ScoredGroup:
    flat = [token for completion in completions for token in completion]
    rollout = RolloutGroup(
        run_id="r",
        group_id="g",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="p",
        worker_id="w",
        policy_version=0,
        temperature=temperature,
        prompt_token_ids=pack_int32(prompt),
        completion_token_ids=pack_int32(flat),
        completion_lengths=pack_int32([len(c) for c in completions]),
        behaviour_logprobs=pack_float32(logprobs if logprobs is not None else [-0.5 - i for i in range(len(flat))]),
        completion_texts=["x"] * len(completions),
        finish_reasons=["stop"] * len(completions),
        generation_s=0.0,
    )
    return ScoredGroup(run_id="r", rollout=rollout, rewards=rewards)


def test_tensorize_right_pads_and_masks_exactly_the_completion_tokens() -> None:
    groups = [
        scored_group([7, 3, 8, 14], [[5, 1], [6]], [1.0, 0.0], temperature=0.5),
        scored_group([4, 14], [[4, 1]], [0.5]),
    ]
    batch = tensorize(groups, PAD, normalize_advantage_by_std=True)

    assert batch.input_ids.tolist() == [[7, 3, 8, 14, 5, 1], [7, 3, 8, 14, 6, PAD], [4, 14, 4, 1, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1] * 5 + [0], [1] * 4 + [0, 0]]
    # Target j - 1 is token j: completion tokens of row 0 sit at targets 3 and 4.
    assert batch.completion_mask.tolist() == [
        [False, False, False, True, True],
        [False, False, False, True, False],
        [False, True, True, False, False],
    ]
    assert batch.behaviour_logprobs[0, 3:5].tolist() == [-0.5, -1.5]
    assert batch.behaviour_logprobs[1, 3].item() == -2.5
    assert batch.behaviour_logprobs[2, 1:3].tolist() == [-0.5, -1.5]
    assert batch.advantages[:, 0].tolist() == pytest.approx(
        [0.5 / (0.5 + ADVANTAGE_EPS), -0.5 / (0.5 + ADVANTAGE_EPS), 0.0]
    )
    assert batch.temperatures.tolist() == [0.5, 0.5, 1.0]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert (batch.num_samples, batch.num_tokens) == (3, 5)


@pytest.mark.parametrize(
    ("group", "reason"),
    [
        (scored_group([7, 3, 99], [[5]], [1.0]), "outside"),
        (scored_group([7, 3], [[5, -1]], [1.0]), "outside"),
        (scored_group([7] * 30, [[5, 5, 5]], [1.0]), "the model holds 32"),
        (scored_group([7, 3], [[5]], [1.0], logprobs=[math.nan]), "NaN"),
        (scored_group([7, 3], [[5]], [math.inf]), "rewards"),
    ],
)
def test_groups_the_model_cannot_hold_are_refused_with_a_reason(group: ScoredGroup, reason: str) -> None:
    with pytest.raises(InvalidGroupError, match=reason):
        validate_group(group, vocab_size=16, max_positions=32)


def test_a_valid_group_passes_validation() -> None:
    validate_group(scored_group([7, 3, 8, 14], [[5, 1], []], [1.0, 0.0]), vocab_size=16, max_positions=32)


def test_token_lags_count_each_token_at_the_version_that_sampled_it() -> None:
    group = scored_group([1, 2], [[3, 4, 5], [6, 7]], [1.0, 0.0])
    mixed = group.model_copy(
        update={
            "rollout": group.rollout.model_copy(
                update={"policy_version": 4, "version_changes": pack_int32([0, 2, 5, 1, 0, 6])}
            )
        }
    )
    plain = group.model_copy(update={"rollout": group.rollout.model_copy(update={"policy_version": 6})})
    admitted = [AdmittedGroup(Delivery("s", "g", f"{i}-0", each, 1), 0, False) for i, each in enumerate([mixed, plain])]

    # learner at 7: sample 0 has 2 tokens of version 4 (lag 3) and 1 of version 5 (lag 2); sample 1 and the
    # plain group's 5 tokens are version 6 (lag 1)
    assert token_lags(admitted, 7) == {"1": 7, "2": 1, "3": 2}


def test_tensorize_masks_out_the_tokens_older_than_the_oldest_trained_version() -> None:
    """per_token admission: of a sample that started on v4 and saw v5 and v6 land, only the tokens of
    versions >= 5 are trained; every sampled token stays in completion_mask, which the trust checks read
    (their keyed-sampling positions count the sample's tokens from its first)."""
    group = scored_group([1, 2], [[3, 4, 5], [6, 7]], [1.0, 0.0])
    mixed = group.model_copy(
        update={
            "rollout": group.rollout.model_copy(
                update={"policy_version": 4, "version_changes": pack_int32([0, 2, 5, 1, 1, 6])}
            )
        }
    )
    every = tensorize([mixed], PAD, normalize_advantage_by_std=True)
    fresh = tensorize([mixed], PAD, normalize_advantage_by_std=True, oldest_trained_version=5)
    # rows: prompt (2) + completion; completion token j of a row sits at target position 1 + j
    assert every.trained_mask is None and every.loss_mask[0, 1:4].tolist() == [True, True, True]
    assert fresh.loss_mask[0, 1:4].tolist() == [False, False, True]  # v4, v4, v5
    assert fresh.loss_mask[1, 1:3].tolist() == [False, True]  # v4, v6
    assert fresh.num_tokens == 2 and every.num_tokens == 5
    assert (fresh.completion_mask == every.completion_mask).all()
    # the rest of the batch is the same
    assert (fresh.behaviour_logprobs == every.behaviour_logprobs).all()
    assert (fresh.advantages == every.advantages).all()


def test_token_lags_with_a_bound_count_only_the_trained_tokens() -> None:
    group = scored_group([1, 2], [[3, 4, 5]], [1.0])
    mixed = group.model_copy(
        update={
            "rollout": group.rollout.model_copy(update={"policy_version": 4, "version_changes": pack_int32([0, 2, 6])})
        }
    )
    admitted = [AdmittedGroup(Delivery("s", "g", "0-0", mixed, 1), 3, False)]
    assert token_lags(admitted, 7) == {"1": 1, "3": 2}
    assert token_lags(admitted, 7, max_lag=2) == {"1": 1}


def test_map_changes_every_tensor_of_the_batch() -> None:
    """take_rows and .to() go through map: a field it forgot would keep every row."""
    from dataclasses import fields

    from services.learner.batch import TrainBatch

    batch = tensorize(
        [scored_group([1, 2], [[3, 4], [5]], [1.0, 0.0])],
        PAD,
        normalize_advantage_by_std=True,
        oldest_trained_version=0,
    )
    taken = batch.map(lambda tensor: tensor[:1])
    for field in fields(TrainBatch):
        value = getattr(taken, field.name)
        assert value is not None and value.shape[0] == 1, field.name
