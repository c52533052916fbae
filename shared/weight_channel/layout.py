"""The bytes of a weight version: a safetensors file, written by the learner and read by the engines.

The safetensors format: an 8-byte little-endian header length, a JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}} padded with spaces to 8 bytes, then every
tensor's bytes back to back.

Writing (the learner, publisher.py). `write_safetensors` lays that out in a buffer the caller allocates (a file
mapping in the learner's spill folder, or anonymous memory): each tensor is copied once, by torch (no
GIL held, the device-to-host copy for a GPU learner), and every chunk whose bytes are complete is
handed to `on_chunk` at once, so the chunk digests are computed on other threads while the copy goes
on. One pass over the weights: no `safetensors.torch.save` (which builds the blob with several copies:
0.46 s for 256 MiB here against 0.13-0.17 s for one copy), no second hash.

Reading (the engines, before a swap). `parse_blob` returns the tensors as `torch.frombuffer` views of the
received buffer (no copy: loading them into the model is the one copy) and raises WeightsLoadError for
bytes that are not a safetensors file; fit.py then checks them against the model.

torch is imported by the functions that need it: the coordinator imports this package without torch.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from shared.weight_channel.manifest import Buffer

if TYPE_CHECKING:
    import torch

SAFETENSORS_DTYPES = {  # safetensors' dtype name -> torch's
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
_SAFETENSORS_NAMES = {torch_name: name for name, torch_name in SAFETENSORS_DTYPES.items()}
HEADER_ALIGN_BYTES = 8
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit


class WeightsLoadError(RuntimeError):
    """A weights blob that does not fit the model (bad bytes, missing/unexpected keys, wrong shapes).
    The engine keeps the weights it had."""


def safetensors_header(tensors: Mapping[str, torch.Tensor]) -> tuple[bytes, list[tuple[str, int, int]]]:
    """The header bytes (length prefix included) and, per tensor in data order, (name, begin, end)
    offsets from the start of the data section."""
    entries: dict[str, dict[str, object]] = {}
    layout: list[tuple[str, int, int]] = []
    offset = 0
    for name, tensor in tensors.items():
        dtype_name = _SAFETENSORS_NAMES.get(str(tensor.dtype).removeprefix("torch."))
        if dtype_name is None:
            raise ValueError(f"{name}: dtype {tensor.dtype} has no safetensors name")
        size_bytes = tensor.numel() * tensor.element_size()
        entries[name] = {
            "dtype": dtype_name,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size_bytes],
        }
        layout.append((name, offset, offset + size_bytes))
        offset += size_bytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % HEADER_ALIGN_BYTES)
    return struct.pack("<Q", len(header)) + header, layout


def safetensors_size(tensors: Mapping[str, torch.Tensor]) -> int:
    header, layout = safetensors_header(tensors)
    return len(header) + (layout[-1][2] if layout else 0)


def write_safetensors(
    tensors: Mapping[str, torch.Tensor],
    buffer: memoryview,
    *,
    chunk_size_bytes: int = 0,
    on_chunk: Callable[[int, memoryview], None] | None = None,
) -> None:
    """Lay `tensors` out as a safetensors file in `buffer` (exactly `safetensors_size` bytes, writable).
    With `on_chunk`, chunk i (bytes [i*chunk_size_bytes, ...)) is passed as a read-only view the moment
    its bytes are all written, in order."""
    import torch

    header, layout = safetensors_header(tensors)
    total = len(header) + (layout[-1][2] if layout else 0)
    if len(buffer) != total:
        raise ValueError(f"the buffer has {len(buffer)} bytes, the file {total}")
    buffer[: len(header)] = header
    done = _ChunkFeed(buffer.toreadonly(), chunk_size_bytes, on_chunk)
    done.advance(len(header))
    data = buffer[len(header) :]
    for name, begin, end in layout:
        if end > begin:
            target = torch.frombuffer(data[begin:end], dtype=torch.uint8)
            target.copy_(tensors[name].detach().reshape(-1).view(torch.uint8))
        done.advance(len(header) + end)
    done.advance(total, final=True)


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
                dtype = getattr(torch, SAFETENSORS_DTYPES[entry["dtype"]])
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


class _ChunkFeed:
    """Hands each chunk to `on_chunk` once the bytes written so far cover it."""

    def __init__(
        self, view: memoryview, chunk_size_bytes: int, on_chunk: Callable[[int, memoryview], None] | None
    ) -> None:
        self.view = view
        self.chunk_size_bytes = chunk_size_bytes
        self.on_chunk = on_chunk if chunk_size_bytes > 0 else None
        self.next_index = 0

    def advance(self, written: int, final: bool = False) -> None:
        if self.on_chunk is None:
            return
        while True:
            begin = self.next_index * self.chunk_size_bytes
            end = min(begin + self.chunk_size_bytes, len(self.view))
            if begin >= len(self.view) or (end > written and not final):
                return
            self.on_chunk(self.next_index, self.view[begin:end])
            self.next_index += 1
