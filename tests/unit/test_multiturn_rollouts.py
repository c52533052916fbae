"""The masked (multi-turn) rollout format: RolloutGroup's mask validation and the learner's tensorize,
which trains exactly the model's tokens (docs/environments.md#the-masked-rollout-format)."""

from __future__ import annotations

import pytest
import torch

from services.learner.batch import InvalidGroupError, tensorize, validate_group
from shared.messages import (
    MessageDecodeError,
    RolloutGroup,
    ScoredGroup,
    pack_float32,
    pack_int32,
    pack_mask,
)

PAD = 0


def episode_group(samples: list[list[tuple[int, int, float]]], *, mask: bool = True, **fields: object) -> RolloutGroup:
    """A group from per-sample (token, mask flag, logprob) triples; prompt [5, 6]."""
    flat = [triple for sample in samples for triple in sample]
    group = RolloutGroup(
        run_id="r",
        group_id="g",
        task_id="t",
        task_name="kuhn_poker",
        prompt="p",
        worker_id="w",
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32([5, 6]),
        completion_token_ids=pack_int32([token for token, _, _ in flat]),
        completion_lengths=pack_int32([len(sample) for sample in samples]),
        behaviour_logprobs=pack_float32([logprob for _, _, logprob in flat]),
        completion_texts=["x"] * len(samples),
        finish_reasons=["stop"] * len(samples),
        generation_s=0.0,
        completion_mask=pack_mask([flag for _, flag, _ in flat]) if mask else b"",
    )
    return group.model_copy(update=fields)


# sample 0: model 7 8 | env 9 9 | model 10; sample 1: model 11 (one turn)
TWO_TURNS = [[(7, 1, -0.5), (8, 1, -0.25), (9, 0, 0.0), (9, 0, 0.0), (10, 1, -1.0)], [(11, 1, -2.0)]]


def decode(group: RolloutGroup) -> RolloutGroup:
    return RolloutGroup.decode(group.encode())


def test_a_masked_group_round_trips_and_splits_per_sample() -> None:
    group = decode(episode_group(TWO_TURNS, env_rewards=[0.25, 1.0]))
    assert group.is_masked and group.env_rewards == [0.25, 1.0]
    assert [mask.tolist() for mask in group.sample_masks()] == [[True, True, False, False, True], [True]]


def test_no_mask_means_every_token_is_the_models() -> None:
    group = decode(episode_group(TWO_TURNS, mask=False))
    assert not group.is_masked
    assert [mask.tolist() for mask in group.sample_masks()] == [[True] * 5, [True]]


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        ({"completion_mask": pack_mask([1, 1, 0, 0, 1])}, "5 entries for 6"),
        ({"completion_mask": pack_mask([1, 1, 0, 2, 1, 1])}, "other than 0 and 1"),
        ({"completion_mask": pack_mask([0, 1, 0, 0, 1, 1])}, "start and end with a model token"),
        ({"completion_mask": pack_mask([1, 1, 0, 0, 0, 1])}, "start and end with a model"),  # sample 0 ends on env
        ({"behaviour_logprobs": pack_float32([-0.5, -0.25, -0.1, 0.0, -1.0, -2.0])}, "0.0 at environment tokens"),
        ({"env_rewards": [0.5]}, "1 env_rewards for 2 samples"),
        ({"env_rewards": [0.5, 1.5]}, r"in \[0, 1\]"),
    ],
)
def test_a_bad_mask_or_env_reward_is_refused_with_its_reason(update: dict[str, object], reason: str) -> None:
    bad = episode_group(TWO_TURNS).model_copy(update=update)  # model_copy skips validation, as a wire payload would
    with pytest.raises(MessageDecodeError, match=reason):
        RolloutGroup.decode(bad.encode())


def test_tensorize_trains_only_the_models_tokens() -> None:
    group = ScoredGroup(run_id="r", rollout=decode(episode_group(TWO_TURNS)), rewards=[1.0, 0.0])
    batch = tensorize([group], PAD, normalize_advantage_by_std=True)
    # row 0: prompt 5 6 | 7 8 9 9 10; targets j-1 hold token j: 7 at 1, 8 at 2, env at 3 4, 10 at 5
    assert batch.input_ids[0].tolist() == [5, 6, 7, 8, 9, 9, 10]
    assert batch.completion_mask[0].tolist() == [False, True, True, False, False, True]
    assert batch.completion_mask[1].tolist() == [False, True, False, False, False, False]
    assert batch.num_tokens == 4  # 3 model tokens + 1: the environment's two are never trained
    assert torch.equal(batch.behaviour_logprobs[0], torch.tensor([0.0, -0.5, -0.25, 0.0, 0.0, -1.0]))


def test_tensorize_of_an_unmasked_group_is_unchanged() -> None:
    group = ScoredGroup(run_id="r", rollout=decode(episode_group(TWO_TURNS, mask=False)), rewards=[1.0, 0.0])
    batch = tensorize([group], PAD, normalize_advantage_by_std=True)
    assert batch.completion_mask[0].tolist() == [False, True, True, True, True, True]
    assert batch.num_tokens == 6


def test_validate_group_accepts_a_masked_group_and_refuses_one_without_model_tokens() -> None:
    validate_group(ScoredGroup(run_id="r", rollout=episode_group(TWO_TURNS), rewards=[1.0, 0.0]), 32, 16)
    no_model = episode_group(TWO_TURNS).model_copy(update={"completion_mask": pack_mask([0] * 6)})
    with pytest.raises(InvalidGroupError, match="no model token"):
        validate_group(ScoredGroup.model_construct(run_id="r", rollout=no_model, rewards=[1.0, 0.0]), 32, 16)
