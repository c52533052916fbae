"""The checks both engines make before loading weights (layout.py parses the bytes): anything that does not
fit raises WeightsLoadError, and the engine keeps the weights it had.

    check_state_fits     full weights: a safetensors state dict with exactly the model's tensor names and
                         shapes. A model with tied embeddings may leave its output head out; when the
                         head is sent, it must equal the input embedding.
    check_adapter_fits   a LoRA adapter: for exactly the model's linear layers that the signed
                         `LoraAdapter` targets, one A (r, in) and one B (out, r) under peft's file names.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from shared.weight_channel.layout import WeightsLoadError, parse_blob
from shared.weight_channel.lora import PEFT_PREFIX, LoraAdapter
from shared.weight_channel.manifest import Buffer

if TYPE_CHECKING:
    import torch

TIED_OUTPUT_KEY = "lm_head.weight"
INPUT_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight")  # Llama/Qwen-style, GPT-2
_ADAPTER_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")


def check_state_fits(
    state: dict[str, torch.Tensor], expected_shapes: dict[str, tuple[int, ...]], ties_output_to_input: bool
) -> str | None:
    """Raises WeightsLoadError unless `state` fits `expected_shapes` (the model's names and shapes; a
    checkpoint's header may leave a tied head out). Returns the input embedding's name in `state`."""
    import torch

    optional = {TIED_OUTPUT_KEY} if ties_output_to_input else set()
    input_key = next((name for name in expected_shapes if name.endswith(INPUT_EMBEDDING_SUFFIXES)), None)
    shapes = dict(expected_shapes)
    if optional and input_key is not None:
        shapes.setdefault(TIED_OUTPUT_KEY, expected_shapes[input_key])
    missing = sorted(expected_shapes.keys() - state.keys() - optional)
    unexpected = sorted(state.keys() - shapes.keys())
    if missing or unexpected:
        raise WeightsLoadError(f"blob does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    wrong_shapes = [
        f"{name}: {tuple(tensor.shape)} != {shapes[name]}"
        for name, tensor in state.items()
        if tuple(tensor.shape) != tuple(shapes[name])
    ]
    if wrong_shapes:
        raise WeightsLoadError(f"blob has tensors of the wrong shape: {wrong_shapes[:5]}")
    if optional and TIED_OUTPUT_KEY in state and input_key is not None:
        if not torch.equal(state[TIED_OUTPUT_KEY], state[input_key]):
            raise WeightsLoadError(f"{TIED_OUTPUT_KEY} differs from {input_key} but the model ties them")
    return input_key


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
