"""The check both engines make before applying a LoRA adapter: the blob must hold, for exactly the
model's linear layers that the signed `LoraAdapter` targets, one A (r, in) and one B (out, r) under
peft's file names. Anything else raises WeightsLoadError and the engine keeps its weights."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from engines.interface import WeightsLoadError
from engines.weights_fit import parse_blob
from shared.lora import PEFT_PREFIX, LoraAdapter
from shared.weights import Buffer

if TYPE_CHECKING:
    import torch

_ADAPTER_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")


def _adapted_linears(weight_shapes: dict[str, tuple[int, ...]], adapter: LoraAdapter) -> dict[str, tuple[int, int]]:
    """Module name -> (out, in) of every 2-D `<module>.weight` whose last name part is a target."""
    targets = set(adapter.target_modules)
    linears: dict[str, tuple[int, int]] = {}
    for name, shape in weight_shapes.items():
        if not name.endswith(".weight") or len(shape) != 2:
            continue
        module = name.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] in targets:
            linears[module] = (int(shape[0]), int(shape[1]))
    return linears


def check_adapter_fits(
    adapter_bytes: Buffer, adapter: LoraAdapter, weight_shapes: dict[str, tuple[int, ...]]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module name -> (A, B) (views of the blob) for every adapted linear layer of the model whose
    tensor names and shapes are `weight_shapes`; raises WeightsLoadError unless the blob is safetensors
    covering exactly those layers with the adapter's rank."""
    tensors = parse_blob(adapter_bytes)
    linears = _adapted_linears(weight_shapes, adapter)
    if not linears:
        raise WeightsLoadError(
            f"the model has no linear layer named like the adapter's targets {adapter.target_modules}"
        )
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _ADAPTER_NAME.match(name.removeprefix(PEFT_PREFIX)) if name.startswith(PEFT_PREFIX) else None
        if match is None:
            raise WeightsLoadError(
                f"{name!r} is not a LoRA tensor name (peft layout: {PEFT_PREFIX}<module>.lora_A.weight)"
            )
        halves.setdefault(match["module"], {})[match["half"]] = tensor
    missing, unexpected = sorted(linears.keys() - halves.keys()), sorted(halves.keys() - linears.keys())
    if missing or unexpected:
        raise WeightsLoadError(
            f"the adapter does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, (num_out, num_in) in linears.items():
        half = halves[module]
        if set(half) != {"A", "B"}:
            raise WeightsLoadError(f"{module}: the adapter has lora_{''.join(sorted(half))} only")
        lora_a, lora_b = half["A"], half["B"]
        if tuple(lora_a.shape) != (adapter.rank, num_in) or tuple(lora_b.shape) != (num_out, adapter.rank):
            raise WeightsLoadError(
                f"{module}: A {tuple(lora_a.shape)} and B {tuple(lora_b.shape)} do not make a rank-{adapter.rank} "
                f"update of a ({num_out}, {num_in}) weight"
            )
        pairs[module] = (lora_a, lora_b)
    return pairs
