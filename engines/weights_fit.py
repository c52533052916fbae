"""The check both engines make before loading a weights blob: it must be a safetensors state dict with
exactly the model's tensor names and shapes. A model with tied embeddings may leave its output head
out; when the head is sent, it must equal the input embedding. Anything else raises WeightsLoadError,
and the engine keeps the weights it had."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engines.interface import WeightsLoadError

if TYPE_CHECKING:
    import torch

TIED_OUTPUT_KEY = "lm_head.weight"
INPUT_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight")  # Llama/Qwen-style, GPT-2


def parse_blob(safetensors_bytes: bytes) -> dict[str, torch.Tensor]:
    """The blob's tensors; raises WeightsLoadError for bytes that are not a safetensors file."""
    from safetensors.torch import load

    try:
        return load(safetensors_bytes)
    except Exception as exc:  # safetensors raises its own error types (and others) for bad bytes
        raise WeightsLoadError(f"not a safetensors blob: {type(exc).__name__}: {exc}") from exc


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
