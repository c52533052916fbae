"""Serialising a state dict straight into the buffer it is published from, hashing as it goes.

The safetensors format: an 8-byte little-endian header length, a JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}} padded with spaces to 8 bytes, then every
tensor's bytes back to back. `write_safetensors` lays that out in a buffer the caller allocates (a file
mapping in the learner's spill folder, or anonymous memory): each tensor is copied once, by torch (no
GIL held, the device-to-host copy for a GPU learner), and every chunk whose bytes are complete is
handed to `on_chunk` at once, so the chunk digests are computed on other threads while the copy goes
on. One pass over the weights: no `safetensors.torch.save` (which builds the blob with several copies:
0.46 s for 256 MiB here against 0.13-0.17 s for one copy), no second hash.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import torch

SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
HEADER_ALIGN_BYTES = 8


def safetensors_header(tensors: dict[str, torch.Tensor]) -> tuple[bytes, list[tuple[str, int, int]]]:
    """The header bytes (length prefix included) and, per tensor in data order, (name, begin, end)
    offsets from the start of the data section."""
    entries: dict[str, dict[str, object]] = {}
    layout: list[tuple[str, int, int]] = []
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: dtype {tensor.dtype} has no safetensors name")
        size_bytes = tensor.numel() * tensor.element_size()
        entries[name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size_bytes],
        }
        layout.append((name, offset, offset + size_bytes))
        offset += size_bytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % HEADER_ALIGN_BYTES)
    return struct.pack("<Q", len(header)) + header, layout


def safetensors_size(tensors: dict[str, torch.Tensor]) -> int:
    header, layout = safetensors_header(tensors)
    return len(header) + (layout[-1][2] if layout else 0)


def write_safetensors(
    tensors: dict[str, torch.Tensor],
    buffer: memoryview,
    *,
    chunk_size_bytes: int = 0,
    on_chunk: Callable[[int, memoryview], None] | None = None,
) -> None:
    """Lay `tensors` out as a safetensors file in `buffer` (exactly `safetensors_size` bytes, writable).
    With `on_chunk`, chunk i (bytes [i*chunk_size_bytes, ...)) is passed as a read-only view the moment
    its bytes are all written, in order."""
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
