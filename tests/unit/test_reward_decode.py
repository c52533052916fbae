"""The reward service decodes the token ids it scores (services/reward/decode.py) with the `tokenizers`
package alone; an honest worker's text, decoded by its engine with transformers, must be exactly that
text, or every honest group would count as a mismatch, and its prompt ids exactly the reward service's
encoding of the task's prompt. Checked on real engine output for the demo's character folder and a
byte-level BPE folder with a BOS, special tokens and two EOS ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engines.interface import Sampling
from engines.torch_engine import TorchEngine
from services.reward.decode import CompletionDecoder, InvalidTokensError
from services.rollout.rollout_groups import build_rollout_group
from shared.messages import RolloutGroup, TaskGroup, pack_float32, pack_int32, pack_mask
from tests.hf_folders import CHAT_TEMPLATE, ENDOFTEXT, IM_END, build_folder

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_folder(
        tmp_path_factory.mktemp("bpe"),
        with_bos=True,
        chat_template=CHAT_TEMPLATE,
        generation_eos_tokens=(ENDOFTEXT, IM_END),
    )


def task_group(prompt: str, max_new_tokens: int) -> TaskGroup:
    return TaskGroup(
        run_id="r", task_id="t", task_name="arithmetic_mod10", prompt=prompt, num_samples=32,
        max_new_tokens=max_new_tokens, temperature=1.0,
    )  # fmt: skip


@pytest.mark.parametrize("folder_name", ["demo", "bpe"])
def test_an_honest_workers_text_is_the_text_the_reward_service_decodes(
    folder_name: str, tiny_policy_dir: Path, bpe_folder: Path
) -> None:
    folder = tiny_policy_dir if folder_name == "demo" else bpe_folder
    engine = TorchEngine(folder)
    decoder = CompletionDecoder(folder, max_new_tokens=6)
    torch.manual_seed(0)
    groups = [
        build_rollout_group(task_group(prompt, 6), samples, "w", 0, 0.0)
        for prompt, samples in zip(
            ["1+2=", "7+9="], engine.generate(["1+2=", "7+9="], Sampling(32, 6, 1.0)), strict=True
        )
    ]
    finish_reasons = [reason for group in groups for reason in group.finish_reasons]
    assert {"stop", "length"} <= set(finish_reasons)  # both decoding paths are exercised
    for group in groups:
        assert decoder.decode(group) == group.completion_texts
        decoder.check_prompt(group, group.prompt)  # the worker's prompt ids are the task's prompt, encoded
    if folder_name == "bpe":
        assert groups[0].prompt_tokens()[0] == engine.tokenizer.bos_token_id  # the BOS rule is exercised


@pytest.fixture
def honest(tiny_policy_dir: Path) -> RolloutGroup:
    """Two samples of the demo's folder: "1" then EOS (stopped), "23" (cut at max_new_tokens 2)."""
    return RolloutGroup(
        run_id="r", group_id="g", task_id="t", task_name="arithmetic_mod10", prompt="1+2=", worker_id="w",
        policy_version=0, temperature=1.0, prompt_token_ids=pack_int32([5, 3, 6, 14]),
        completion_token_ids=pack_int32([5, 1, 6, 7]), completion_lengths=pack_int32([2, 2]),
        behaviour_logprobs=pack_float32([-0.5] * 4), completion_texts=["1", "23"], finish_reasons=["stop", "length"],
        generation_s=0.0,
    )  # fmt: skip


def with_tokens(group: RolloutGroup, completion_ids: list[int], **update: object) -> RolloutGroup:
    return group.model_copy(update={"completion_token_ids": pack_int32(completion_ids), **update})


def test_the_demo_folder_decodes_and_the_ids_are_checked_before(honest: RolloutGroup, tiny_policy_dir: Path) -> None:
    decoder = CompletionDecoder(tiny_policy_dir, max_new_tokens=2)
    assert decoder.vocab_size == 15 and decoder.eos_ids.tolist() == [1]
    assert decoder.decode(honest) == ["1", "23"]
    bad = {
        "completion token id 15 is outside the vocabulary [0, 15)": with_tokens(honest, [5, 1, 6, 15]),
        "completion token id -3 is outside": with_tokens(honest, [5, 1, -3, 7]),
        "prompt token id 99 is outside": honest.model_copy(update={"prompt_token_ids": pack_int32([99])}),
        "sample 0 says it stopped but does not end with an EOS id": with_tokens(honest, [5, 6, 6, 7]),
        "sample 1 goes on after an EOS id": with_tokens(honest, [5, 1, 1, 7]),
        "non-finite behaviour log-probs": honest.model_copy(
            update={"behaviour_logprobs": pack_float32([-0.5, float("nan"), -0.5, -0.5])}
        ),
    }
    for reason, group in bad.items():
        with pytest.raises(InvalidTokensError, match=reason.replace("[", r"\[").replace(")", r"\)")):
            decoder.decode(group)
    with pytest.raises(InvalidTokensError, match="sample 0 has 2 tokens, more than max_new_tokens 1"):
        CompletionDecoder(tiny_policy_dir, max_new_tokens=1).decode(honest)


def test_lengths_and_log_probs_that_do_not_add_up_are_refused_when_the_message_is_decoded(
    honest: RolloutGroup,
) -> None:
    for update in (
        {"completion_lengths": pack_int32([2, 3])},
        {"behaviour_logprobs": pack_float32([-0.5] * 3)},
        {"completion_texts": ["1"]},
    ):
        payload = honest.model_dump() | update
        with pytest.raises(ValueError):
            RolloutGroup.model_validate(payload)
    assert np.array_equal(honest.sample_tokens()[1], [6, 7])


def test_a_folder_without_tokenizer_json_is_one_clear_error(tmp_path: Path) -> None:
    from shared.tokenization import ModelFolderError

    with pytest.raises(ModelFolderError, match="no tokenizer.json"):
        CompletionDecoder(tmp_path, max_new_tokens=2)


def episode_rollout(turns: list[tuple[list[int], int]], finish_reason: str = "stop") -> RolloutGroup:
    """One masked sample from (ids, mask flag) spans: a multi-turn episode as a worker would send it."""
    ids = [token for span, _ in turns for token in span]
    flags = [flag for span, flag in turns for _ in span]
    return RolloutGroup(
        run_id="r", group_id="g", task_id="t", task_name="kuhn_poker", prompt="p", worker_id="w",
        policy_version=0, temperature=1.0, prompt_token_ids=pack_int32([5]), completion_token_ids=pack_int32(ids),
        completion_lengths=pack_int32([len(ids)]),
        behaviour_logprobs=pack_float32([-1.0 if flag else 0.0 for flag in flags]),
        completion_texts=["x"], finish_reasons=[finish_reason], generation_s=0.0, completion_mask=pack_mask(flags),
    )  # fmt: skip


def test_a_multi_turn_sample_is_split_into_decoded_turns_and_observation_ids(poker_policy_dir: Path) -> None:
    decoder = CompletionDecoder(poker_policy_dir, max_new_tokens=6)
    eos = int(decoder.eos_ids[0])
    check, call = decoder.encode_observation("check"), decoder.encode_observation("call")
    observation = decoder.encode_observation("opp=bets;pot=3;fold/call?")
    [episode] = decoder.decode_episodes(episode_rollout([(check + [eos], 1), (observation, 0), (call + [eos], 1)]), 2)
    assert episode.actions == ["check", "call"]
    assert episode.observation_ids == [observation]
    assert episode.text == "checkopp=bets;pot=3;fold/call?call"


@pytest.mark.parametrize(
    ("turns", "finish_reason", "reason"),
    [
        ("eos inside", "stop", "goes on after an EOS id"),
        ("three turns", "stop", "more than max_turns 2"),
        ("short without eos", "length", "ends before max_new_tokens without an EOS id"),
        ("too long", "length", "more than max_new_tokens 6"),
        ("says length", "length", "disagrees with its last token"),
    ],
)
def test_a_multi_turn_sample_no_engine_makes_is_refused(
    poker_policy_dir: Path, turns: str, finish_reason: str, reason: str
) -> None:
    decoder = CompletionDecoder(poker_policy_dir, max_new_tokens=6)
    eos = int(decoder.eos_ids[0])
    check, bet = decoder.encode_observation("check"), decoder.encode_observation("bet")
    observation = decoder.encode_observation("pot=3;")
    spans = {
        "eos inside": [(bet[:1] + [eos] + bet[1:] + [eos], 1)],
        "three turns": [(bet + [eos], 1), (observation, 0), (bet + [eos], 1), (observation, 0), (bet + [eos], 1)],
        "short without eos": [(bet, 1), (observation, 0), (bet + [eos], 1)],
        "too long": [(check + check, 1)],
        "says length": [(bet + [eos], 1)],
    }[turns]
    with pytest.raises(InvalidTokensError, match=reason):
        decoder.decode_episodes(episode_rollout(spans, finish_reason), 2)
