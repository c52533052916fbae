"""What the keyed-sampling tests of the engines share (shared/keyed_sampling.py): a tiny model folder whose
next-token distributions are neither flat nor one-hot, and the verifier's check of a sample's tokens under
a transformers fp32 forward of the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engines.interface import InferenceEngine, Sample
from engines.keyed_tensors import choice_gaps
from tests.hf_folders import CHAT_TEMPLATE, ENDOFTEXT, IM_END, build_folder

GAP_TOLERANCE = 1e-3  # probability mass: fp32 engines vs an fp32 reference differ by ~1e-6 per CDF entry


def build_keyed_folder(out_dir: Path) -> Path:
    """A Qwen3 with a ~400-token vocabulary (head_dim 32 for vLLM's CPU attention, 256 positions), its
    weights perturbed: a random init is near-uniform over the vocabulary."""
    from transformers import AutoModelForCausalLM

    path = build_folder(
        out_dir,
        chat_template=CHAT_TEMPLATE,
        generation_eos_tokens=(ENDOFTEXT, IM_END),
        head_dim=32,
        max_position_embeddings=256,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.4 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(path)
    return path


def load_reference(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def build_cpu_engine(kind: Any, folder: Path, kv_cache_bytes: int = 64 << 20) -> InferenceEngine:
    from engines.select import build_engine
    from shared.config import RolloutConfig

    return build_engine(kind, folder, RolloutConfig(engine=kind, vllm_kv_cache_bytes=kv_cache_bytes), device="cpu")


def reference_logprobs(reference: Any, sample: Sample, temperature: float) -> torch.Tensor:
    """(N, V) the verifier's log_softmax(logits / T) at each of the sample's N completion positions."""
    ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
    with torch.no_grad():
        logits = reference(input_ids=ids).logits[0].float()  # (T, V)
    num_prompt = len(sample.prompt_token_ids)
    return torch.log_softmax(logits[num_prompt - 1 : num_prompt - 1 + sample.num_tokens] / temperature, dim=-1)


def gaps_of(reference: Any, sample: Sample, seed: int, temperature: float) -> torch.Tensor:
    """(N,) choice_gaps of the sample's tokens, keyed with `seed`, under the reference: 0 where a token is
    keyed sampling's pick."""
    positions = torch.arange(sample.num_tokens)
    return choice_gaps(
        reference_logprobs(reference, sample, temperature),
        torch.tensor(sample.token_ids),
        torch.full_like(positions, seed),
        positions,
    )
