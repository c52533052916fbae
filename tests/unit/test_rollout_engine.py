"""TorchEngine on a tiny locally built Qwen2: shapes, greedy determinism, behaviour logprobs against a
teacher-forced recomputation, EOS, padding, and weight swaps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as safetensors_save

from engines.interface import Sampling, UnencodablePromptError, WeightsLoadError
from engines.torch_engine import TorchEngine
from shared.weight_channel import TIED_OUTPUT_KEY

torch.set_num_threads(1)

MIXED_PROMPTS = ["3+4=", "12+345=", "9=", "0+0+0+0="]


@pytest.fixture
def engine(model_dir: Path) -> TorchEngine:
    return TorchEngine(model_dir)


def weights_blob(engine: TorchEngine, noise_scale: float = 0.0, seed: int = 0) -> bytes:
    """safetensors bytes of the engine's weights (tied lm_head left out, as the learner sends them)."""
    generator = torch.Generator().manual_seed(seed)
    return safetensors_save(
        {
            name: (tensor + noise_scale * torch.randn(tensor.shape, generator=generator)).contiguous()
            for name, tensor in engine.model.state_dict().items()
            if name != TIED_OUTPUT_KEY
        }
    )


def teacher_forced_logprobs(
    engine: TorchEngine, prompt_ids: list[int], completion_ids: list[int], temperature: float
) -> torch.Tensor:
    """What the learner computes: one forward on prompt + completion, log_softmax(logits / T) at each completion token."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0]  # (T, V)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(completion_ids) - 1)
    return logprobs[positions, torch.tensor(completion_ids)]


def test_character_tokenizer_gives_one_token_per_character_and_no_bos(engine: TorchEngine) -> None:
    assert len(engine.encode_prompts(["3+4="])[0]) == 4


def test_groups_have_the_requested_shape_and_consistent_lengths(engine: TorchEngine) -> None:
    torch.manual_seed(0)
    groups = engine.generate(MIXED_PROMPTS, Sampling(5, 3, 1.0))

    assert len(groups) == len(MIXED_PROMPTS)
    for prompt, group in zip(MIXED_PROMPTS, groups, strict=True):
        assert len(group) == 5
        for sample in group:
            assert len(sample.prompt_token_ids) == len(prompt)
            assert 1 <= sample.num_tokens <= 3
            assert len(sample.logprobs) == sample.num_tokens
            assert all(logprob <= 0.0 for logprob in sample.logprobs)


def test_eos_ends_a_sample_and_is_left_out_of_its_text(engine: TorchEngine) -> None:
    torch.manual_seed(0)
    eos = engine.tokenizer.eos_token_id
    samples = [s for group in engine.generate(MIXED_PROMPTS * 16, Sampling(8, 6, 1.0)) for s in group]

    stopped = [s for s in samples if s.finish_reason == "stop"]
    cut = [s for s in samples if s.finish_reason == "length"]
    assert stopped and cut  # a random 16-token policy emits EOS about once in 16 tokens
    for sample in stopped:
        assert sample.token_ids[-1] == eos and eos not in sample.token_ids[:-1]
        assert sample.text == engine.tokenizer.decode(sample.token_ids[:-1])
    for sample in cut:
        assert sample.num_tokens == 6 and eos not in sample.token_ids
    assert any(s.num_tokens < 6 for s in stopped)  # some rows stopped while others went on


def test_behaviour_logprobs_equal_a_teacher_forced_recomputation(engine: TorchEngine) -> None:
    torch.manual_seed(1)
    temperature = 0.7
    groups = engine.generate(MIXED_PROMPTS, Sampling(4, 5, temperature))

    for group in groups:
        for sample in group:
            expected = teacher_forced_logprobs(engine, sample.prompt_token_ids, sample.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


def test_greedy_is_deterministic_and_batching_prompts_of_different_lengths_changes_nothing(engine: TorchEngine) -> None:
    batched = engine.generate(MIXED_PROMPTS, Sampling(3, 4, 1.0, greedy=True))
    again = engine.generate(MIXED_PROMPTS, Sampling(3, 4, 1.0, greedy=True))
    alone = [engine.generate([prompt], Sampling(1, 4, 1.0, greedy=True))[0][0] for prompt in MIXED_PROMPTS]

    assert [[s.token_ids for s in g] for g in batched] == [[s.token_ids for s in g] for g in again]
    for group, single in zip(batched, alone, strict=True):
        assert all(sample.token_ids == single.token_ids for sample in group)
        torch.testing.assert_close(torch.tensor(group[0].logprobs), torch.tensor(single.logprobs), atol=1e-5, rtol=0)


def test_a_prompt_the_tokenizer_cannot_represent_is_refused(engine: TorchEngine) -> None:
    with pytest.raises(UnencodablePromptError):
        engine.generate(["3+4=", "é+1="], Sampling(2, 2, 1.0))


def test_loading_weights_changes_outputs_and_sets_the_version(engine: TorchEngine) -> None:
    assert engine.policy_version == -1
    original = weights_blob(engine)
    before = engine.generate(MIXED_PROMPTS, Sampling(1, 3, 1.0, greedy=True))

    engine.load_weights(weights_blob(engine, noise_scale=0.5), policy_version=3)
    changed = engine.generate(MIXED_PROMPTS, Sampling(1, 3, 1.0, greedy=True))
    engine.load_weights(original, policy_version=4)
    restored = engine.generate(MIXED_PROMPTS, Sampling(1, 3, 1.0, greedy=True))

    assert engine.policy_version == 4
    assert [g[0].logprobs for g in changed] != [g[0].logprobs for g in before]
    for was, now in zip(before, restored, strict=True):
        assert now[0].token_ids == was[0].token_ids
        torch.testing.assert_close(torch.tensor(now[0].logprobs), torch.tensor(was[0].logprobs), atol=1e-6, rtol=0)


def test_a_blob_that_does_not_fit_the_model_is_refused_and_the_old_weights_stay(engine: TorchEngine) -> None:
    engine.load_weights(weights_blob(engine), policy_version=1)
    before = engine.generate(MIXED_PROMPTS, Sampling(1, 3, 1.0, greedy=True))
    state = {name: t.clone() for name, t in engine.model.state_dict().items() if name != TIED_OUTPUT_KEY}
    first = next(iter(state))
    bad_blobs = {
        "not safetensors": b"\x00garbage" * 100,
        "truncated": weights_blob(engine, noise_scale=1.0)[:-100],
        "missing key": safetensors_save({k: v for k, v in state.items() if k != first}),
        "unexpected key": safetensors_save({**state, "model.extra.weight": torch.zeros(2)}),
        "wrong shape": safetensors_save({**state, first: torch.zeros(3, 3)}),
        "untied head": safetensors_save({**state, TIED_OUTPUT_KEY: torch.ones_like(engine.model.lm_head.weight)}),
    }

    for reason, blob in bad_blobs.items():
        with pytest.raises(WeightsLoadError):
            engine.load_weights(blob, policy_version=2)
        assert engine.policy_version == 1, reason

    after = engine.generate(MIXED_PROMPTS, Sampling(1, 3, 1.0, greedy=True))
    assert [g[0].logprobs for g in after] == [g[0].logprobs for g in before]


def test_the_engines_compute_in_the_folders_dtype_unless_the_run_file_says(tmp_path: Path) -> None:
    from engines.select import engine_dtype
    from shared.config import RolloutConfig

    folder = tmp_path / "model"
    folder.mkdir()
    for stored, expected in [
        ("bfloat16", "bfloat16"),
        ("float16", "bfloat16"),
        ("float32", "float32"),
        (None, "float32"),
    ]:
        (folder / "config.json").write_text(json.dumps({"dtype": stored} if stored else {}))
        assert engine_dtype(RolloutConfig(), folder) == expected, stored
    assert engine_dtype(RolloutConfig(dtype="float32"), folder) == "float32"
    (folder / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))  # transformers 4's name
    assert engine_dtype(RolloutConfig(), folder) == "bfloat16"
    assert engine_dtype(RolloutConfig(dtype="float32"), folder) == "float32"


def test_sampling_uses_this_transformers_versions_cache_argument_without_deprecation_warnings(
    engine: TorchEngine,
) -> None:
    import inspect
    import warnings

    from engines.torch_engine import kv_cache_argument

    assert kv_cache_argument(engine.model) in inspect.signature(engine.model.forward).parameters
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.generate(MIXED_PROMPTS, Sampling(2, 4, 1.0))
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
