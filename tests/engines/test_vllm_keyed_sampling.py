"""Keyed sampling in the vLLM engine (engines/vllm_keyed_sampler.py) against the reference, on real vLLM (CPU):

- every token vLLM picks with seeds is keyed sampling's pick under a transformers fp32 forward of the same
  weights (shared.keyed_sampling.choice_gaps ~ 0 at every position), sample j with seed s + j;
- the same seeds give the same completions, other seeds others;
- vLLM's picks equal the torch engine's for the same weights, prompts and seeds (fp32 both);
- the behaviour log-probs are still the processed ones, log_softmax(logits / T);
- rows without a keyed seed and greedy rows batched with keyed ones keep vLLM's own sampling;
- a prefill split across steps keeps its keyed tokens (tests/engines/test_vllm_keyed_preemption.py: a
  preempted request).

One folder (tests/keyed_checks.py: a tiny Qwen3 with a ~400-token vocabulary), one engine of each kind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.interface import InferenceEngine, Sample, Sampling
from engines.keyed_tensors import keyed_uniform
from engines.vllm_keyed_sampler import KEYED_SEED_ARG
from shared.keyed_sampling import task_seed
from tests import keyed_checks
from tests.keyed_checks import GAP_TOLERANCE, build_cpu_engine, build_keyed_folder, load_reference, reference_logprobs
from tests.vllm_required import require_vllm

pytestmark = pytest.mark.vllm

TEMPERATURE = 0.7
PROMPTS = ["3+4=", "12+345=", "hello what is", "The quick brown"]
SEEDS = [task_seed(f"task-{i}") for i in range(len(PROMPTS))]
NUM_SAMPLES = 4
MAX_NEW_TOKENS = 24
SAMPLING = Sampling(NUM_SAMPLES, MAX_NEW_TOKENS, TEMPERATURE)
ATOL = 1e-4  # log-probs, as tests/engines/test_engine_contract.py


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_keyed_folder(tmp_path_factory.mktemp("keyed"))


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    return load_reference(folder)


@pytest.fixture(scope="module")
def vllm_engine(folder: Path) -> Iterator[InferenceEngine]:
    require_vllm()
    engine = build_cpu_engine("vllm", folder)
    yield engine
    engine.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def torch_engine(folder: Path) -> InferenceEngine:
    return build_cpu_engine("torch", folder)


def gaps_of(reference: Any, sample: Sample, seed: int) -> torch.Tensor:
    return keyed_checks.gaps_of(reference, sample, seed, TEMPERATURE)


def tokens_of(groups: list[list[Sample]]) -> list[list[list[int]]]:
    return [[sample.token_ids for sample in group] for group in groups]


def test_every_token_is_keyed_samplings_pick_under_the_reference(vllm_engine: InferenceEngine, reference: Any) -> None:
    groups = vllm_engine.generate(PROMPTS, SAMPLING, sampling_seeds=SEEDS)

    gaps = torch.cat(
        [
            gaps_of(reference, sample, seed + j)
            for seed, group in zip(SEEDS, groups, strict=True)
            for j, sample in enumerate(group)
        ]
    )
    assert gaps.numel() > len(PROMPTS) * NUM_SAMPLES * 4  # completions long enough to check many positions
    assert gaps.max().item() < GAP_TOLERANCE
    assert (gaps == 0).float().mean().item() > 0.95  # an edge case is rare: u within ~1e-6 of a CDF entry
    # sample j was keyed with seed + j, not seed: under seed its tokens are mostly not the picks
    wrong = torch.cat([gaps_of(reference, group[1], seed) for seed, group in zip(SEEDS, groups, strict=True)])
    assert (wrong > GAP_TOLERANCE).any()


def test_the_same_seeds_give_the_same_completions_and_other_seeds_others(vllm_engine: InferenceEngine) -> None:
    first = vllm_engine.generate(PROMPTS, SAMPLING, sampling_seeds=SEEDS)
    again = vllm_engine.generate(PROMPTS, SAMPLING, sampling_seeds=SEEDS)
    other = vllm_engine.generate(PROMPTS, SAMPLING, sampling_seeds=[s + 1000 for s in SEEDS])
    # sample j of seed s is sample 0 of seed s + j, whatever else is in the batch
    shifted = vllm_engine.generate(PROMPTS[:1], Sampling(1, MAX_NEW_TOKENS, TEMPERATURE), sampling_seeds=[SEEDS[0] + 2])

    assert tokens_of(again) == tokens_of(first)
    assert [[s.logprobs for s in g] for g in again] == [[s.logprobs for s in g] for g in first]
    different = [
        a != b for ga, gb in zip(tokens_of(first), tokens_of(other), strict=True) for a, b in zip(ga, gb, strict=True)
    ]
    assert sum(different) >= len(different) - 2
    assert len({tuple(s.token_ids) for s in first[0]}) > 1  # the samples of one prompt differ from each other
    assert shifted[0][0].token_ids == first[0][2].token_ids


def test_vllm_picks_the_torch_engines_tokens(
    vllm_engine: InferenceEngine, torch_engine: InferenceEngine, reference: Any
) -> None:
    """The same keyed choice on two engines' fp32 numbers: equal, but where u falls within the engines'
    difference (~1e-6) of a CDF entry; there the completions part, and the reference shows why."""
    vllm_groups = vllm_engine.generate(PROMPTS, SAMPLING, sampling_seeds=SEEDS)
    torch_groups = torch_engine.generate(PROMPTS, SAMPLING, sampling_seeds=SEEDS)

    num_same = 0
    for seed, vllm_group, torch_group in zip(SEEDS, vllm_groups, torch_groups, strict=True):
        for j, (ours, theirs) in enumerate(zip(vllm_group, torch_group, strict=True)):
            if ours.token_ids == theirs.token_ids:
                num_same += 1
                continue
            part = next(i for i, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids, strict=False)) if a != b)
            assert distance_to_an_edge(reference, ours, seed + j, part) < GAP_TOLERANCE
    assert num_same >= 0.9 * len(PROMPTS) * NUM_SAMPLES


def distance_to_an_edge(reference: Any, sample: Sample, seed: int, position: int) -> float:
    """How far u at `position` is from the nearest CDF entry of the reference's distribution there."""
    cdf = reference_logprobs(reference, sample, TEMPERATURE)[position].double().exp().cumsum(-1)
    u = keyed_uniform(torch.tensor([seed]), torch.tensor([position])).double()
    return float((cdf / cdf[-1] - u).abs().min())


def test_behaviour_logprobs_are_the_processed_logprobs(vllm_engine: InferenceEngine, reference: Any) -> None:
    for temperature in (TEMPERATURE, 1.3):
        groups = vllm_engine.generate(PROMPTS, Sampling(NUM_SAMPLES, MAX_NEW_TOKENS, temperature), sampling_seeds=SEEDS)
        for group in groups:
            for sample in group:
                logprobs = reference_logprobs(reference, sample, temperature)
                expected = logprobs[torch.arange(sample.num_tokens), torch.tensor(sample.token_ids)]
                torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=ATOL, rtol=0)


def test_other_rows_keep_vllms_sampling_beside_keyed_ones(vllm_engine: InferenceEngine, reference: Any) -> None:
    """One vLLM batch of a keyed request, an unseeded one, one with vLLM's own seed and a greedy one (the
    engine never mixes them; vLLM's continuous batching could): the keyed one is still keyed, vLLM samples
    the others as ever, the greedy one is the argmax."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine: Any = vllm_engine
    prompt_ids = vllm_engine.encode_prompts(PROMPTS[:1])[0]
    common: dict[str, Any] = dict(max_tokens=MAX_NEW_TOKENS, logprobs=0, detokenize=False, ignore_eos=True)
    params = [
        SamplingParams(temperature=TEMPERATURE, extra_args={KEYED_SEED_ARG: SEEDS[0]}, **common),
        SamplingParams(temperature=TEMPERATURE, n=3, **common),
        SamplingParams(temperature=TEMPERATURE, seed=SEEDS[0], **common),
        SamplingParams(temperature=0.0, **common),
    ]
    outputs = engine.call_on_engine_thread(
        engine.llm.generate, [TokensPrompt(prompt_token_ids=prompt_ids)] * len(params), params, use_tqdm=False
    )
    keyed, unseeded, vllm_seeded, greedy = ([list(c.token_ids) for c in output.outputs] for output in outputs)

    assert gaps_of(reference, completion(prompt_ids, keyed[0]), SEEDS[0]).max().item() < GAP_TOLERANCE
    assert len({tuple(tokens) for tokens in unseeded}) > 1  # vLLM's own random draws
    assert gaps_of(reference, completion(prompt_ids, vllm_seeded[0]), SEEDS[0]).max().item() > GAP_TOLERANCE
    assert reference_logprobs(reference, completion(prompt_ids, greedy[0]), 1.0).argmax(-1).tolist() == greedy[0]


def completion(prompt_ids: list[int], token_ids: list[int]) -> Sample:
    return Sample(prompt_ids, token_ids, [0.0] * len(token_ids), "", "length")


def test_a_prefill_split_across_steps_keeps_its_keyed_tokens(vllm_engine: InferenceEngine, reference: Any) -> None:
    """Prompts beyond one step's token budget (4096 on CPU) split a prefill, whose sample is discarded: with
    vLLM's per-request generators (SamplingParams.seed) that step crashes vLLM 0.32 on CPU (`CPU Generator
    does not use offset`); keyed requests carry no generator."""
    prompts = [" ".join(["hello what is the answer"] * 12) + f" {i}" for i in range(80)]  # 65 tokens each
    seeds = [task_seed(f"long-{i}") for i in range(len(prompts))]

    groups = vllm_engine.generate(prompts, Sampling(1, 8, TEMPERATURE), sampling_seeds=seeds)

    assert sum(len(group[0].prompt_token_ids) for group in groups) > 4096
    for seed, (sample,) in zip(seeds, groups, strict=True):
        assert gaps_of(reference, sample, seed).max().item() < GAP_TOLERANCE


def test_greedy_ignores_seeds_and_a_seed_per_prompt_is_required(vllm_engine: InferenceEngine) -> None:
    plain = vllm_engine.generate(PROMPTS, Sampling(2, 8, 1.0, greedy=True))
    assert vllm_engine.generate(PROMPTS, Sampling(2, 8, 1.0, greedy=True), sampling_seeds=SEEDS) == plain
    with pytest.raises(ValueError, match="seeds for"):
        vllm_engine.generate(PROMPTS, Sampling(2, 8, 1.0), sampling_seeds=SEEDS[:1])
