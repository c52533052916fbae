"""Tiny random-init Qwen2 models for learner tests (seeded: the same weights on every call)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from services.learner.precision import set_config_dtype


def tiny_qwen2(vocab_size: int, tied: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(config)


def pretrained_like_folder(tiny_policy_dir: Path, out_dir: Path) -> Path:
    """The demo's tiny Qwen2 with a pretrained model's weight magnitudes (2-D weights ~ N(0, 0.16): median
    |w| 0.11, as SmolLM2-135M's 0.108; norm gains ~1), rounded to bf16 and saved as a bf16 checkpoint,
    so every precision starts from the same weights and bf16 rounding moves its log-probs as on a real model."""
    shutil.copytree(tiny_policy_dir, out_dir, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(noise * 0.16 if parameter.dim() == 2 else 1 + 0.1 * noise)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    set_config_dtype(out_dir, torch.bfloat16)
    return out_dir
