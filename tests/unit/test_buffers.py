"""Version-sized buffers faulted in ahead of use (shared/weight_channel/buffers.py): the spare is handed out only when
it fits, a file spare becomes the requested file, and nothing is left behind."""

from __future__ import annotations

from pathlib import Path

from shared.weight_channel.buffers import SPARE_SUFFIX, SpareBuffers, allocate_buffer


def test_the_spare_is_used_when_the_size_and_place_match_and_replaced_otherwise(tmp_path: Path) -> None:
    spares = SpareBuffers()
    spares.prepare(4096)
    spares.wait(10.0)
    buffer = spares.take(4096)
    assert len(buffer) == 4096 and not buffer.readonly and spares.num_taken_spare == 1
    buffer[:5] = b"hello"

    spares.prepare(4096)
    spares.wait(10.0)
    other = spares.take(8192)  # another size: a fresh buffer, the spare dropped
    assert len(other) == 8192 and spares.num_taken_spare == 1 and spares.num_allocated == 1
    assert bytes(buffer[:5]) == b"hello"  # a buffer handed out is never handed out again


def test_a_file_spare_becomes_the_requested_file(tmp_path: Path) -> None:
    spares = SpareBuffers()
    spares.prepare(10_000, tmp_path)
    spares.wait(10.0)
    assert [path.suffix for path in tmp_path.iterdir()] == [SPARE_SUFFIX]
    target = tmp_path / "3-full.safetensors"
    buffer = spares.take(10_000, target)
    buffer[-3:] = b"end"
    buffer.obj.flush()  # type: ignore[union-attr]
    assert [path.name for path in tmp_path.iterdir()] == [target.name]
    assert target.stat().st_size == 10_000 and target.read_bytes()[-3:] == b"end"

    spares.prepare(10_000, tmp_path)
    spares.wait(10.0)
    spares.discard()
    assert [path.name for path in tmp_path.iterdir()] == [target.name]


def test_zero_bytes_and_populated_buffers() -> None:
    assert len(allocate_buffer(0)) == 0
    populated = allocate_buffer(1 << 20, populate=True)
    populated[-1] = 7
    assert populated[-1] == 7 and populated[0] == 0
