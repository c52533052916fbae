"""The check both engines make before loading a weights blob: it must be a safetensors state dict with
exactly the model's tensor names and shapes. A model with tied embeddings may leave its output head
out; when the head is sent, it must equal the input embedding. Anything else raises WeightsLoadError,
and the engine keeps the weights it had."""

from __future__ import annotations

import json
import math
import struct
import warnings
from typing import TYPE_CHECKING

from engines.interface import WeightsLoadError
from shared.weights import Buffer

if TYPE_CHECKING:
    import torch

TIED_OUTPUT_KEY = "lm_head.weight"
INPUT_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight")  # Llama/Qwen-style, GPT-2


_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit


def parse_blob(safetensors_bytes: Buffer) -> dict[str, torch.Tensor]:
    """The blob's tensors, as views of its bytes (no copy: loading them into a model is the one copy);
    raises WeightsLoadError for bytes that are not a safetensors file (the format: an 8-byte
    little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the data)."""
    import torch

    view = memoryview(safetensors_bytes).cast("B")
    try:
        (header_size,) = struct.unpack_from("<Q", view, 0)
        if header_size > min(MAX_HEADER_BYTES, len(view) - 8):
            raise ValueError(f"header of {header_size} bytes in a blob of {len(view)}")
        header = json.loads(bytes(view[8 : 8 + header_size]))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        data = view[8 + header_size :]
        tensors: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():  # a read-only buffer: never written through (loading copies)
            warnings.simplefilter("ignore", UserWarning)
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                dtype = getattr(torch, _DTYPES[entry["dtype"]])
                shape = [int(size) for size in entry["shape"]]
                begin, end = (int(offset) for offset in entry["data_offsets"])
                expected = math.prod(shape) * dtype.itemsize
                if not 0 <= begin <= end <= len(data) or end - begin != expected:
                    raise ValueError(f"{name}: data_offsets {begin}..{end} for {expected} bytes of {len(data)}")
                flat = torch.frombuffer(data[begin:end], dtype=dtype) if expected else torch.empty(0, dtype=dtype)
                tensors[name] = flat.reshape(shape)
        return tensors
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
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
