"""The learner's one-pass serialiser and the engines' zero-copy parser agree with the safetensors library,
and bad bytes are refused with a clear error (shared/weight_channel/layout.py)."""

from __future__ import annotations

import ctypes
import json
import struct

import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from engines.interface import WeightsLoadError
from shared.weight_channel import parse_blob, safetensors_size, write_safetensors


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(7, 5, generator=generator).to(torch.bfloat16),
        "model.norm.weight": torch.randn(5, generator=generator),
        "steps": torch.tensor(3, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "flags": torch.tensor([True, False, True]),
    }


def written(state: dict[str, torch.Tensor], chunk_size_bytes: int = 0) -> tuple[bytearray, list[tuple[int, bytes]]]:
    buffer = bytearray(safetensors_size(state))
    chunks: list[tuple[int, bytes]] = []
    write_safetensors(
        state, memoryview(buffer), chunk_size_bytes=chunk_size_bytes, on_chunk=lambda i, v: chunks.append((i, bytes(v)))
    )
    return buffer, chunks


def test_the_one_pass_file_is_what_safetensors_reads_and_every_chunk_is_handed_over_once() -> None:
    state = tensors()
    buffer, chunks = written(state, chunk_size_bytes=24)
    loaded = safetensors_load(bytes(buffer))
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in state.items())
    assert [index for index, _ in chunks] == list(range(-(-len(buffer) // 24)))
    assert b"".join(data for _, data in chunks) == bytes(buffer)  # complete chunks, in order
    (header_size,) = struct.unpack_from("<Q", buffer)
    assert header_size % 8 == 0  # tensor data stays 8-byte aligned, as safetensors writes it


def test_parsing_is_zero_copy_and_reads_the_librarys_own_files() -> None:
    blob = safetensors_save(tensors())
    buffer = bytearray(blob)
    parsed = parse_blob(memoryview(buffer))
    assert all(torch.equal(parsed[name], tensor) for name, tensor in tensors().items())
    norm = parsed["model.norm.weight"]
    before = norm.clone()
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    offset = norm.data_ptr() - address
    assert 0 < offset < len(buffer)  # the tensor's data is the buffer's own bytes
    buffer[offset] ^= 0xFF
    assert not torch.equal(norm, before)  # a view: it sees the change


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda blob: blob[:4], "unpack"),
        (lambda blob: struct.pack("<Q", 1 << 40) + blob[8:], "header of"),
        (lambda blob: struct.pack("<Q", 2) + b"[]" + blob[10:], "not a JSON object"),
        (lambda blob: blob[:-3], "data_offsets"),
    ],
)
def test_bad_bytes_are_refused_with_the_reason(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WeightsLoadError, match=f"not a safetensors blob.*{reason}"):
        parse_blob(mutate(safetensors_save(tensors())))


def test_an_unknown_dtype_is_refused() -> None:
    header = json.dumps({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}).encode()
    with pytest.raises(WeightsLoadError, match="Q7"):
        parse_blob(struct.pack("<Q", len(header)) + header + b"\x00")
