"""What a LoRA policy version is, on the wire: the adapter's shape, signed into the version's manifest.

A LoRA run (`[lora] enabled = true`) publishes, per version, only the adapter tensors: a safetensors
blob in peft's file layout (the bytes of a peft `adapter_model.safetensors`: names like
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, A of shape (r, in), B of shape (out, r)).
A worker turns it back into a policy on the base it holds: W = W_base + (alpha / r) * B @ A for every
target module. That is only the learner's policy if the worker's base is the learner's, so the
manifest names the base by `base_fingerprint`: the model folder's fingerprint (tokenizer +
architecture) and the bytes of its weight files. Both sides compute it from their own folder.

This module imports neither torch nor peft (the coordinator and shared/ stay light).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import blake3
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from shared.tokenization import model_fingerprint

PEFT_PREFIX = "base_model.model."  # peft's adapter files name tensors under this prefix
ADAPTER_FILE = "adapter_model.safetensors"  # peft's (and vLLM's) adapter folder layout
ADAPTER_CONFIG_FILE = "adapter_config.json"
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin")


class LoraAdapter(BaseModel):
    """The adapter a LoRA version's payload holds. Producer: the learner (inside the signed Manifest).
    Consumers: workers (follower.py checks the base, engines apply it)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    rank: int = Field(ge=1, le=256, description="r: A is (r, in), B is (out, r)")
    alpha: float = Field(gt=0, description="the adapter's output is scaled by alpha / rank")
    target_modules: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        min_length=1, description="the linear layers (last name part) that carry an adapter"
    )
    base_fingerprint: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="base_fingerprint() of the model folder the adapter applies to"
    )

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config_json(self) -> dict[str, object]:
        """adapter_config.json for this adapter, as peft writes it (what vLLM's LoRA loader reads)."""
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
            "target_modules": sorted(self.target_modules),
            "bias": "none",
            "fan_in_fan_out": False,
            "use_rslora": False,
            "use_dora": False,
            "modules_to_save": None,
        }


def base_fingerprint(model_dir: Path) -> str:
    """blake3 over the folder's model_fingerprint and the bytes of its weight files (sorted by name):
    two folders with the same fingerprint hold the same base weights for the same tokenizer."""
    digest = blake3.blake3(model_fingerprint(model_dir).encode())
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and path.name.endswith(WEIGHT_FILE_SUFFIXES):
            digest.update(path.name.encode() + b"\0")
            with path.open("rb") as weights:
                while block := weights.read(16 << 20):
                    digest.update(block)
    return digest.hexdigest()
