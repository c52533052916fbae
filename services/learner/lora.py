"""LoRA in the learner: peft adapters on a frozen base, and the views of them the rest of the learner needs.

    apply_lora           freeze the base, inject peft LoRA layers into the model in place (the model stays
                         the HF causal LM: grpo.token_logprobs, the auditor and the trainer see no wrapper)
    adapter_state        the adapter tensors in peft's file layout: what a version publishes (shared/weight_channel/lora.py)
    merged_state         the base's state dict with every adapter merged in (W + (alpha / r) B A): what the
                         evaluator's engine and model_final take
    restore_adapter      put a checkpoint's adapter back (a checkpoint holds `adapter_state`: the base is
                         the model folder)

Why in place rather than peft's PeftModel wrapper: PeftModel forwards attribute lookups through two
levels (`model.base_model` would be peft's LoraModel, not the decoder body), and the learner's chunked
log-prob path reads `model.base_model` and the output head directly.

Multi-rank (FSDP2) learners do not take LoRA yet: apply_lora refuses a world size > 1 (the policy passes
its own; docs/lora.md).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TypeVar, cast

import torch

from shared.config import LoraConfig
from shared.weight_channel import PEFT_PREFIX, LoraAdapter, base_fingerprint

log = logging.getLogger(__name__)

ADAPTER_NAME = "default"  # peft's name for the one adapter
ModelT = TypeVar("ModelT", bound=torch.nn.Module)


def apply_lora(
    model: ModelT, config: LoraConfig, adapter_dtype: torch.dtype | None = None, *, world_size: int = 1
) -> ModelT:
    """Freeze `model` and give each target linear layer a LoRA adapter (B = 0: the policy is unchanged
    until the first step), its weights in `adapter_dtype` (None: the base's; mixed precision passes
    float32 on a bf16 base: the adapters are the masters the optimizer steps). world_size: the ranks the
    policy is sharded over. Returns the same model object. Raises ValueError where LoRA cannot run."""
    if world_size > 1:
        raise ValueError(
            f"[lora] enabled with WORLD_SIZE={world_size}: the multi-rank learner does not train LoRA adapters yet; "
            "run the LoRA learner as one process (docs/lora.md)"
        )
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    model.requires_grad_(False)
    peft_config = PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,  # type: ignore[arg-type]  # peft annotates int; it only divides by r
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        bias="none",
    )
    try:
        inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER_NAME)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"[lora] target_modules {list(config.target_modules)} do not fit the model: {exc}") from exc
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    not_linear = [
        name
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and not isinstance(module, LoraLinear)
    ]
    if not_linear:
        raise ValueError(
            f"[lora] target_modules must name linear layers; {not_linear[:3]} are not (engines merge B A into a weight)"
        )
    if adapter_dtype is not None:
        for parameter in model.parameters():
            if parameter.requires_grad:  # the adapters: peft made them in the base layer's dtype
                parameter.data = parameter.data.to(adapter_dtype)
    num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    num_total = sum(p.numel() for p in model.parameters())
    log.info(
        "LoRA r=%d alpha=%g on %s: %d trainable parameters of %d (%.2f%%)",
        config.rank,
        config.alpha,
        list(config.target_modules),
        num_trainable,
        num_total,
        100 * num_trainable / max(num_total, 1),
    )
    return model


def is_lora(model: torch.nn.Module) -> bool:
    """True for a model apply_lora injected adapters into (peft is imported only if one was)."""
    if "peft" not in sys.modules:
        return False
    from peft.tuners.lora import LoraLayer

    return any(isinstance(module, LoraLayer) for module in model.modules())


def adapter_spec(config: LoraConfig, model_dir: Path) -> LoraAdapter:
    """The signed description of this run's adapters (the base named by its folder's fingerprint)."""
    return LoraAdapter(
        rank=config.rank,
        alpha=config.alpha,
        target_modules=list(config.target_modules),
        base_fingerprint=base_fingerprint(model_dir),
    )


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors under peft's file names (`base_model.model.<module>.lora_A.weight`, (r, in);
    `...lora_B.weight`, (out, r)), detached and contiguous: the bytes of an adapter_model.safetensors."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME)
    return {PEFT_PREFIX + name: tensor.detach().contiguous() for name, tensor in state.items()}


def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy as plain HF state-dict names and shapes: each adapted layer's weight is
    W_base + (alpha / r) B A (the base itself untouched); a model without adapters: its state dict."""
    if not is_lora(model):
        return dict(model.state_dict())
    from peft.tuners.lora import Linear as LoraLinear

    merged: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if ".lora_" in name:
            continue
        merged[name.replace(".base_layer.", ".")] = tensor
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LoraLinear):  # apply_lora made sure every adapted layer is one
                base_weight = cast(torch.Tensor, module.get_base_layer().weight)  # (out, in)
                merged[f"{name}.weight"] = base_weight + module.get_delta_weight(ADAPTER_NAME).to(base_weight.dtype)
    return merged


def restore_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put a checkpoint's `adapter_state` back; raises ValueError if it is not this run's adapter."""
    from peft import set_peft_model_state_dict

    expected = adapter_state(model)
    if set(state) != set(expected):
        raise ValueError(
            "the checkpoint does not hold this run's LoRA adapter "
            f"(e.g. {sorted(set(state) ^ set(expected))[:3]}): was it written by a full-weight run or another [lora]?"
        )
    unprefixed = {name.removeprefix(PEFT_PREFIX): tensor for name, tensor in state.items()}
    set_peft_model_state_dict(model, unprefixed, adapter_name=ADAPTER_NAME)
