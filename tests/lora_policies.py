"""LoRA policies for the LoRA tests: adapters randomised as after training (seeded), the learner's LoRA
model on a folder's base, and the learner's recomputation of an engine sample's log-probs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engines.interface import Sample
from services.learner.grpo import token_logprobs
from services.learner.lora import apply_lora
from services.learner.trainer import load_policy
from shared.config import LoraConfig


def randomise_adapter(model: torch.nn.Module, seed: int, scale: float, marker: str = ".lora_B.") -> None:
    """Every adapter parameter whose name holds `marker` (".lora_B.": B only; ".lora_": A and B too)
    drawn from scale * N(0, 1), so the adapter changes the policy (B starts at 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if marker in name:
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))


def lora_policy(folder: Path, config: LoraConfig, seed: int, scale: float, marker: str = ".lora_B.") -> torch.nn.Module:
    """The learner's LoRA policy on the folder's base (services/learner/lora.py), adapter randomised, in eval mode."""
    model, _ = load_policy(folder)
    apply_lora(model, config)
    randomise_adapter(model, seed, scale, marker)
    return model.eval()


def learner_logprobs(model: Any, sample: Sample, temperature: float) -> torch.Tensor:
    """The learner's recomputation of the sample's completion log-probs (its own chunked path)."""
    ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
    with torch.no_grad():
        logprobs = token_logprobs(model, ids, torch.ones_like(ids), torch.tensor([temperature]))[0]  # (T - 1,)
    first = len(sample.prompt_token_ids) - 1
    return logprobs[first : first + sample.num_tokens]
