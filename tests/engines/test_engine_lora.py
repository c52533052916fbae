"""LoRA versions in every InferenceEngine (torch, vLLM): the engine holds the base (its folder), takes the
adapter blob the learner publishes (peft layout, services/learner/lora.py) and then samples exactly
the learner's LoRA policy:

- the log-probs of its own samples at temperature 0.7 equal the learner's recomputation
  (grpo.token_logprobs on the peft model, the learner's own code path) within 1e-4;
- a second adapter applies onto the base, not onto the first version (its log-probs match the
  learner's second model, which never held the first adapter);
- an adapter that does not fit (another rank, a layer missing) is refused and the old version stays;
- full weights loaded after an adapter are the whole policy: the adapter no longer applies.

One engine per (engine, folder), shared by the module's tests. vLLM's CPU attention needs head_dim >= 32.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from safetensors.torch import save as safetensors_save

from engines.interface import InferenceEngine, Sampling, WeightsLoadError
from services.learner.lora import adapter_spec, adapter_state
from shared.config import LoraConfig
from shared.weight_channel import LoraAdapter
from tests.hf_folders import build_folder
from tests.lora_policies import learner_logprobs, lora_policy
from tests.vllm_required import require_vllm

torch.set_num_threads(1)

ATOL = 1e-4  # fp32 engines vs the fp32 learner
RANK = 8
PROMPTS = ["3+4=", "12+345=", "The quick"]
CASES = [pytest.param(kind, id=kind, marks=[pytest.mark.vllm] if kind == "vllm" else []) for kind in ("torch", "vllm")]


@dataclass(frozen=True)
class Learner:
    """The learner's side: the folder's model with LoRA adapters, as services/learner/lora.py makes it."""

    folder: Path
    config: LoraConfig

    def model(self, seed: int) -> Any:
        """A LoRA policy on the folder's base whose adapter differs per seed (A and B both random)."""
        return lora_policy(self.folder, self.config, seed, scale=0.3, marker=".lora_")

    def spec(self) -> LoraAdapter:
        return adapter_spec(self.config, self.folder)


def publish(model: Any) -> bytes:
    return safetensors_save(adapter_state(model))


@pytest.fixture(scope="module", params=CASES)
def case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[InferenceEngine, Learner]]:
    kind: Literal["torch", "vllm"] = request.param
    if kind == "vllm":
        require_vllm()
    from engines.select import build_engine
    from shared.config import RolloutConfig

    folder = build_folder(
        tmp_path_factory.mktemp("lora-folder"), head_dim=32, max_position_embeddings=256, tie_word_embeddings=False
    )
    engine = build_engine(
        kind, folder, RolloutConfig(engine=kind, vllm_kv_cache_bytes=64 << 20), device="cpu", max_lora_rank=RANK
    )
    yield engine, Learner(folder, LoraConfig(enabled=True, rank=RANK, alpha=16.0))
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def assert_engine_samples_the_learners_policy(engine: InferenceEngine, model: Any) -> None:
    groups = engine.generate(PROMPTS, Sampling(3, 6, 0.7))
    for group in groups:
        for sample in group:
            expected = learner_logprobs(model, sample, 0.7)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=ATOL, rtol=0)


def test_an_adapter_applied_by_the_engine_samples_the_learners_lora_policy_and_the_next_one_replaces_it(
    case: tuple[InferenceEngine, Learner],
) -> None:
    engine, learner = case
    first, second = learner.model(seed=1), learner.model(seed=2)
    engine.load_adapter(publish(first), learner.spec(), policy_version=1)
    assert engine.policy_version == 1
    assert_engine_samples_the_learners_policy(engine, first)

    engine.load_adapter(publish(second), learner.spec(), policy_version=2)  # onto the base, not onto version 1
    assert engine.policy_version == 2
    assert_engine_samples_the_learners_policy(engine, second)


def test_an_adapter_that_does_not_fit_is_refused_and_the_old_version_stays(
    case: tuple[InferenceEngine, Learner],
) -> None:
    engine, learner = case
    model = learner.model(seed=3)
    engine.load_adapter(publish(model), learner.spec(), policy_version=3)
    state = adapter_state(model)

    other_rank = learner.spec().model_copy(update={"rank": 4})
    with pytest.raises(WeightsLoadError, match="rank-4"):
        engine.load_adapter(publish(model), other_rank, policy_version=4)
    missing_layer = {name: tensor for name, tensor in state.items() if "layers.0.self_attn.q_proj" not in name}
    with pytest.raises(WeightsLoadError, match="missing"):
        engine.load_adapter(safetensors_save(missing_layer), learner.spec(), policy_version=4)
    with pytest.raises(WeightsLoadError, match="not a LoRA tensor name"):
        engine.load_adapter(safetensors_save({"model.norm.weight": torch.ones(32)}), learner.spec(), policy_version=4)

    assert engine.policy_version == 3
    assert_engine_samples_the_learners_policy(engine, model)


def test_full_weights_after_an_adapter_are_the_whole_policy(case: tuple[InferenceEngine, Learner]) -> None:
    from services.learner.lora import merged_state

    engine, learner = case
    model = learner.model(seed=4)
    engine.load_adapter(publish(model), learner.spec(), policy_version=5)
    merged = {name: tensor.contiguous() for name, tensor in merged_state(model).items()}
    engine.load_weights(safetensors_save(merged), policy_version=6)  # the same policy as plain weights
    assert engine.policy_version == 6
    assert_engine_samples_the_learners_policy(engine, model)  # an adapter still applied would move it
