"""One contract for every InferenceEngine (torch, vLLM) on tiny local folders, checked against a plain
transformers forward of the same weights (fp32):

- n samples per prompt with the sampled tokens' log-probs, finish reasons, EOS kept in the tokens and
  out of the text, prompt ids exactly those of shared.tokenization.encode_prompt;
- after a full weight update and a second one building on it, log-probs of the engine's own samples
  at temperature 0.7 equal log_softmax(logits / 0.7) of transformers (the learner's recomputation),
  and greedy decoding equals transformers' greedy decoding;
- a prompt longer than one KV block, sampled before and after an update, gets the new weights'
  log-probs (a stale prefix cache would serve the old ones);
- a blob that does not fit is refused and the old weights and version stay.

Folders: a Qwen3 with tied embeddings, a chat template and two EOS ids; a Qwen3 with an untied head and a tokenizer
that adds a BOS and has no pad token; the demo's character-level Qwen2 with a second EOS id in its generation config (both are frequent there).
vLLM's CPU attention needs head_dim >= 32, so the models use 32. One engine per (engine, folder),
shared by the module's tests: each test loads the weights it checks first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from engines.interface import (
    InferenceEngine,
    PromptTooLongError,
    Sample,
    Sampling,
    UnencodablePromptError,
    WeightsLoadError,
)
from shared.messages import ChatMessage
from shared.tokenization import PromptInput, encode_prompt, eos_token_ids
from tests.hf_folders import CHAT_TEMPLATE, ENDOFTEXT, IM_END, build_char_folder, build_folder
from tests.vllm_required import require_vllm

torch.set_num_threads(1)

TIED_OUTPUT_KEY = "lm_head.weight"
ATOL = 1e-4  # fp32 engines vs fp32 transformers; measured differences are ~1e-6
PROMPTS: list[str | PromptInput] = [
    "3+4=",
    "12+345=",
    PromptInput("9+9=", (ChatMessage(role="user", content="9+9="),)),  # the chat template where there is one
]
LONG_PROMPT = "+".join(str(i) for i in range(60))  # > 128 tokens: fills at least one vLLM KV block (CPU)


@dataclass(frozen=True)
class Folder:
    path: Path
    reference: Any  # transformers model on the folder: the weights a test loads are loaded here too
    tied: bool

    def blob(self, state: dict[str, torch.Tensor]) -> bytes:
        """The state as the learner sends it: safetensors bytes, a tied head left out."""
        return safetensors_save(
            {k: v.contiguous() for k, v in state.items() if not (self.tied and k == TIED_OUTPUT_KEY)}
        )

    def perturbed(self, state: dict[str, torch.Tensor], noise_scale: float, seed: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return {k: v + noise_scale * torch.randn(v.shape, generator=generator) for k, v in state.items()}

    def load_reference(self, blob: bytes) -> None:
        self.reference.load_state_dict(safetensors_load(blob), strict=False)


def with_generation_eos(folder: Path, extra_eos_token: str) -> Path:
    """generation_config.json listing a second EOS id (as instruct checkpoints do); on the 16-token
    character vocabulary it is sampled often, so both EOS ids end samples."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(extra_eos_token)]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder


FOLDER_BUILDERS = {
    "qwen3-tied-chat": lambda out: build_folder(
        out,
        chat_template=CHAT_TEMPLATE,
        generation_eos_tokens=(ENDOFTEXT, IM_END),  # an instruct model's two EOS ids: both stop
        head_dim=32,
        max_position_embeddings=256,
    ),
    "qwen3-untied-bos-padless": lambda out: build_folder(
        out, with_bos=True, with_pad=False, tie_word_embeddings=False, head_dim=32, max_position_embeddings=256
    ),
    "char-qwen2": lambda out: with_generation_eos(build_char_folder(out), extra_eos_token="="),
}
ENGINE_CASES = [
    pytest.param((kind, folder), id=f"{kind}-{folder}", marks=[pytest.mark.vllm] if kind == "vllm" else [])
    for kind in ("torch", "vllm")
    for folder in FOLDER_BUILDERS
]


@pytest.fixture(scope="module", params=ENGINE_CASES)
def case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[InferenceEngine, Folder]]:
    kind, folder_name = request.param
    if kind == "vllm":
        require_vllm()
    from transformers import AutoModelForCausalLM

    path = FOLDER_BUILDERS[folder_name](tmp_path_factory.mktemp(folder_name))
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tied = reference.get_output_embeddings().weight is reference.get_input_embeddings().weight
    engine = build(kind, path)
    assert engine.policy_version == -1
    yield engine, Folder(path, reference, tied)
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def build(kind: Literal["torch", "vllm"], path: Path) -> InferenceEngine:
    from engines.select import build_engine
    from shared.config import RolloutConfig

    return build_engine(kind, path, RolloutConfig(engine=kind, vllm_kv_cache_bytes=64 << 20), device="cpu")


@pytest.fixture
def engine(case: tuple[InferenceEngine, Folder]) -> InferenceEngine:
    return case[0]


@pytest.fixture
def folder(case: tuple[InferenceEngine, Folder]) -> Folder:
    return case[1]


def base_state(folder: Folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder.path / "model.safetensors"))


def tokenizer_of(folder: Folder) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder.path)


def teacher_forced_logprobs(folder: Folder, sample: Sample, temperature: float) -> torch.Tensor:
    """What the learner computes: one forward on prompt + completion, log_softmax(logits / T) at each completion token."""
    ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
    with torch.no_grad():
        logits = folder.reference(input_ids=ids).logits[0]  # (T, V)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    num_prompt = len(sample.prompt_token_ids)
    positions = torch.arange(num_prompt - 1, num_prompt - 1 + sample.num_tokens)
    return logprobs[positions, torch.tensor(sample.token_ids)]


def transformers_greedy(
    folder: Folder, prompt_ids: list[int], max_new_tokens: int, stop_ids: frozenset[int]
) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            token = int(folder.reference(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token in stop_ids:
            break
    return ids[len(prompt_ids) :]


def assert_logprobs_match_reference(folder: Folder, groups: list[list[Sample]], temperature: float) -> None:
    for group in groups:
        for sample in group:
            expected = teacher_forced_logprobs(folder, sample, temperature)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=ATOL, rtol=0)


def test_samples_carry_prompt_ids_tokens_logprobs_and_finish_reasons(engine: InferenceEngine, folder: Folder) -> None:
    tokenizer = tokenizer_of(folder)
    eos = eos_token_ids(folder.path, tokenizer)
    groups = engine.generate(PROMPTS * 4, Sampling(4, 8, 1.0))

    assert len(groups) == len(PROMPTS) * 4
    for prompt, group in zip(PROMPTS * 4, groups, strict=True):
        assert len(group) == 4
        for sample in group:
            assert sample.prompt_token_ids == encode_prompt(tokenizer, prompt)
            assert 1 <= sample.num_tokens <= 8 and len(sample.logprobs) == sample.num_tokens
            assert all(logprob <= 0.0 for logprob in sample.logprobs)
            assert not eos & set(sample.token_ids[:-1])
            if sample.finish_reason == "stop":
                assert sample.token_ids[-1] in eos
            else:
                assert sample.num_tokens == 8 and sample.token_ids[-1] not in eos
            visible = sample.token_ids[:-1] if sample.finish_reason == "stop" else sample.token_ids
            assert sample.text == tokenizer.decode(visible, clean_up_tokenization_spaces=False)
    if folder.path.name.startswith("char-qwen2"):  # ~2 tokens in 16 are EOS: both endings, both EOS ids occur
        assert {s.finish_reason for g in groups for s in g} == {"stop", "length"}
        assert {s.token_ids[-1] for g in groups for s in g if s.finish_reason == "stop"} == eos


def test_logprobs_match_transformers_after_a_full_update_and_one_building_on_it(
    engine: InferenceEngine, folder: Folder
) -> None:
    first = folder.perturbed(base_state(folder), noise_scale=0.3, seed=1)
    second = folder.perturbed(first, noise_scale=0.05, seed=2)  # what a delta rebuilds: the first plus a step

    for policy_version, state in ((1, first), (2, second)):
        blob = folder.blob(state)
        engine.load_weights(blob, policy_version=policy_version)
        folder.load_reference(blob)
        groups = engine.generate(PROMPTS, Sampling(4, 6, 0.7))

        assert engine.policy_version == policy_version
        assert_logprobs_match_reference(folder, groups, temperature=0.7)


def test_greedy_decoding_matches_transformers_greedy(engine: InferenceEngine, folder: Folder) -> None:
    blob = folder.blob(folder.perturbed(base_state(folder), noise_scale=0.5, seed=3))
    engine.load_weights(blob, policy_version=3)
    folder.load_reference(blob)
    eos = eos_token_ids(folder.path, tokenizer_of(folder))

    groups = engine.generate(PROMPTS, Sampling(2, 6, 1.0, greedy=True))

    for group in groups:
        expected = transformers_greedy(folder, group[0].prompt_token_ids, 6, eos)
        assert [sample.token_ids for sample in group] == [expected, expected]
    assert_logprobs_match_reference(folder, groups, temperature=1.0)


def test_a_prompt_sampled_before_and_after_an_update_gets_the_new_weights(
    engine: InferenceEngine, folder: Folder
) -> None:
    tokenizer = tokenizer_of(folder)
    prompt = "12+345=" if folder.path.name.startswith("char-qwen2") else LONG_PROMPT  # 32 positions there
    if prompt == LONG_PROMPT:
        assert len(encode_prompt(tokenizer, prompt)) > 128  # a full KV block: vLLM caches it by prefix
    old, new = (folder.blob(folder.perturbed(base_state(folder), noise_scale=0.5, seed=s)) for s in (4, 5))
    engine.load_weights(old, policy_version=4)
    before = engine.generate([prompt], Sampling(2, 4, 1.0, greedy=True))

    engine.load_weights(new, policy_version=5)
    after = engine.generate([prompt], Sampling(2, 4, 1.0, greedy=True))

    folder.load_reference(new)
    assert_logprobs_match_reference(folder, after, temperature=1.0)
    assert after[0][0].logprobs != before[0][0].logprobs


def test_a_blob_that_does_not_fit_is_refused_and_the_old_weights_stay(engine: InferenceEngine, folder: Folder) -> None:
    state = folder.perturbed(base_state(folder), noise_scale=0.2, seed=6)
    engine.load_weights(folder.blob(state), policy_version=6)
    before = engine.generate(PROMPTS, Sampling(1, 4, 1.0, greedy=True))
    kept = {k: v for k, v in state.items() if k != TIED_OUTPUT_KEY}
    first = next(iter(kept))
    bad_blobs = {
        "not safetensors": b"\x00garbage" * 100,
        "truncated": folder.blob(state)[:-100],
        "missing key": safetensors_save({k: v.contiguous() for k, v in kept.items() if k != first}),
        "unexpected key": safetensors_save({**kept, "model.extra.weight": torch.zeros(2)}),
        "wrong shape": safetensors_save({**kept, first: torch.zeros(3, 3)}),
    }
    if folder.tied:
        embedding = next(v for k, v in kept.items() if k.endswith("embed_tokens.weight"))
        bad_blobs["untied head"] = safetensors_save({**kept, TIED_OUTPUT_KEY: torch.ones_like(embedding)})

    for reason, blob in bad_blobs.items():
        with pytest.raises(WeightsLoadError):
            engine.load_weights(blob, policy_version=7)
        assert engine.policy_version == 6, reason

    after = engine.generate(PROMPTS, Sampling(1, 4, 1.0, greedy=True))
    assert [g[0].token_ids for g in after] == [g[0].token_ids for g in before]
    for was, now in zip(before, after, strict=True):
        torch.testing.assert_close(torch.tensor(now[0].logprobs), torch.tensor(was[0].logprobs), atol=1e-6, rtol=0)


def test_prompts_the_model_cannot_take_are_refused(engine: InferenceEngine, folder: Folder) -> None:
    with pytest.raises(PromptTooLongError):
        engine.generate(["3+4="], Sampling(1, 1000, 1.0))
    if folder.path.name.startswith("char-qwen2"):  # byte-level BPE represents every character
        with pytest.raises(UnencodablePromptError):
            engine.generate(["3+4=", "é+1="], Sampling(2, 2, 1.0))


def test_a_context_continued_from_token_ids_gets_the_learners_logprobs(engine: InferenceEngine, folder: Folder) -> None:
    """Multi-turn episodes (engines/episodes.py): prompt, a model turn, an observation's ids, then the next turn."""
    blob = folder.blob(folder.perturbed(base_state(folder), noise_scale=0.3, seed=4))
    engine.load_weights(blob, policy_version=4)
    folder.load_reference(blob)
    prompt_ids = engine.encode_prompts(PROMPTS[:2], 4)
    first_turns = engine.generate(PROMPTS[:2], Sampling(1, 4, 1.0, greedy=True))
    assert engine.generate_from_ids(prompt_ids, Sampling(1, 4, 1.0, greedy=True)) == first_turns

    observation = engine.encode_observation("1+2=")
    assert observation == tokenizer_of(folder)("1+2=", add_special_tokens=False)["input_ids"]
    assert engine.encode_observation("") == []
    contexts = [ids + sample.token_ids + observation for ids, (sample,) in zip(prompt_ids, first_turns, strict=True)]
    second_turns = engine.generate_from_ids(contexts, Sampling(3, 5, 0.7))

    for context, group in zip(contexts, second_turns, strict=True):
        assert all(sample.prompt_token_ids == context for sample in group)
    assert_logprobs_match_reference(folder, second_turns, temperature=0.7)
    with pytest.raises(PromptTooLongError):
        engine.generate_from_ids(contexts, Sampling(1, 1000, 1.0))


def reference_distributions(folder: Folder, sample: Sample, temperature: float) -> torch.Tensor:
    """(num_tokens, V) log_softmax(logits / T) of transformers at each completion position of `sample`."""
    ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
    with torch.no_grad():
        logits = folder.reference(input_ids=ids).logits[0]  # (T, V)
    num_prompt = len(sample.prompt_token_ids)
    return torch.log_softmax(logits[num_prompt - 1 : num_prompt - 1 + sample.num_tokens] / temperature, dim=-1)


def test_keyed_sampling_picks_what_the_seed_says_and_repeats(engine: InferenceEngine, folder: Folder) -> None:
    from engines.keyed_tensors import choice_gaps

    blob = folder.blob(folder.perturbed(base_state(folder), noise_scale=0.3, seed=5))
    engine.load_weights(blob, policy_version=5)
    folder.load_reference(blob)
    seeds = [1_000 + 97 * i for i in range(len(PROMPTS))]

    groups = engine.generate(PROMPTS, Sampling(4, 8, 0.7), sampling_seeds=seeds)
    again = engine.generate(PROMPTS, Sampling(4, 8, 0.7), sampling_seeds=seeds)
    other = engine.generate(PROMPTS, Sampling(4, 8, 0.7), sampling_seeds=[s + 50 for s in seeds])

    assert [[s.token_ids for s in g] for g in again] == [[s.token_ids for s in g] for g in groups]
    assert [[s.token_ids for s in g] for g in other] != [[s.token_ids for s in g] for g in groups]
    assert_logprobs_match_reference(folder, groups, temperature=0.7)  # behaviour log-probs unchanged
    for seed, group in zip(seeds, groups, strict=True):
        for j, sample in enumerate(group):
            gaps = choice_gaps(
                reference_distributions(folder, sample, 0.7),
                torch.tensor(sample.token_ids),
                torch.full((sample.num_tokens,), seed + j),
                torch.arange(sample.num_tokens),
            )
            assert float(gaps.max()) < 1e-4, (seed + j, gaps.tolist())  # fp32 on both sides: only rounding
