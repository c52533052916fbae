"""Delta versions: policy version v as the difference from a base version, compressed.

Three codecs, each exact bit for bit for any bytes (the safetensors header, NaNs, odd lengths), each
self-describing by its 4-byte magic, so `apply_delta(base, delta)` needs no codec name:

    sub32-zigzag-shuffle4-zstd  (magic RLD2)   words = the bytes as little-endian uint32 words
        delta  = zstd(shuffle4(zigzag(words_v - words_base)))
        full_v = words_base + unzigzag(unshuffle4(unzstd(delta)))          (mod 2**32)
    sub16-zigzag-shuffle2-zstd  (magic RL16)   the same on uint16 words
    sparse16-gaps-zigzag-zstd   (magic RLSP)   only the uint16 words that changed
        i      = positions where words_v != words_base (ascending)
        delta  = zstd(shuffle(gaps(i) - 1) + shuffle2(zigzag(words_v[i] - words_base[i])))
        full_v = words_base, then words_v[i] = words_base[i] + unzigzag(...)  (mod 2**16)

Why subtraction: one optimizer step moves a weight by a tiny amount, so sign and exponent stay put
and the integer difference of the two bit patterns is a small number, positive or negative. Zigzag
maps small negatives to small positives (-1 -> 1, 1 -> 2), so the high bytes of every word are zero;
grouping byte 0 of every word, then byte 1, ... (the "shuffle" of blosc and HDF5) puts those zeros
next to each other, where zstd finds them. On float32 weights after one Adam step this is about a
third smaller than XOR + shuffle (XOR flips every mantissa bit a carry crosses).

Why a 16-bit word: bf16 weights are 16-bit words; in a uint32 word two of them share one difference,
a borrow couples them, and the shuffle mixes the low byte of one weight's difference with the high
byte of its neighbour's. sub16 keeps one weight per word (docs/deltas.md has the measured sizes).

Why sparse: at the learning rates of real post-training (1e-6 .. 1e-5) a bf16 weight moves by less
than half its rounding step most of the time, so most 16-bit words do not change at all. The dense
codecs still spend zstd's few bits on every unchanged word; sparse spends nothing on them and
writes, per changed word, the gap to the previous change (1 for a neighbour, stored minus 1 as the
narrowest of uint8/16/32/64 that fits the largest gap, byte-shuffled) and the zigzag difference.

`encode_smallest` builds sparse16, then each dense candidate, and keeps the smallest. A dense candidate
is skipped when its size, estimated by compressing 32 evenly spaced blocks of the blob (8 MiB, for
blobs of 64 MiB and more), is over 1.25x the best so far, and abandoned as soon as the compressed bytes
it already emitted exceed the best size (zstd never takes them back). Only the estimate can err, and
only towards a bigger (still exact) delta.

Every zstd frame carries its checksum, so a corrupt payload is a DeltaError at decode; the caller
still checks the rebuilt weights against the manifest's `full_digest` (the wrong base decodes fine).

Inputs may be `bytes` or any C-contiguous buffer (memoryviews of mmaps): no `bytes` methods here.
No torch here: this runs on the learner and on every worker, on raw safetensors bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
import zstandard

from shared.weight_channel.manifest import Buffer

CODEC = "sub32-zigzag-shuffle4-zstd"  # the first codec; `encode_delta` makes it
SUB16 = "sub16-zigzag-shuffle2-zstd"
SPARSE16 = "sparse16-gaps-zigzag-zstd"

_DENSE_HEADER = struct.Struct("<4sQ")  # magic, length of the full target in bytes
_SPARSE_HEADER = struct.Struct("<4sQQB")  # magic, target length in bytes, number of changed words, gap width in bytes
_SPARSE_MAGIC = b"RLSP"
_GAP_DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)
_THREADS_MIN_BYTES = 8 << 20  # zstd worker threads pay only on inputs of several MiB
_STREAM_BYTES = 8 << 20  # input fed per compress call when a candidate may be abandoned early
_SAMPLE_MIN_BYTES = 64 << 20  # below this every candidate is compressed in full
_SAMPLE_NUM_BLOCKS = 32  # evenly spaced blocks of the blob ...
_SAMPLE_BLOCK_BYTES = 256 << 10  # ... of this size: an 8 MiB sample
_SKIP_MARGIN = 1.25  # skip a candidate whose sampled estimate is this much bigger than the best so far


class DeltaError(ValueError):
    """A delta payload that cannot be decoded (unknown codec, truncated, or not for this base)."""


@dataclass(frozen=True)
class _Dense:
    """sub<bits>-zigzag-shuffle<bytes>-zstd on unsigned words of `word_bytes`."""

    name: str
    magic: bytes
    word_bytes: int

    @property
    def unsigned(self) -> type[np.unsignedinteger]:
        return np.uint32 if self.word_bytes == 4 else np.uint16

    @property
    def signed(self) -> type[np.signedinteger]:
        return np.int32 if self.word_bytes == 4 else np.int16


_SUB32 = _Dense(CODEC, b"RLD2", 4)
_SUB16 = _Dense(SUB16, b"RL16", 2)
_DENSE = {_SUB32.magic: _SUB32, _SUB16.magic: _SUB16}
CODECS = (CODEC, SUB16, SPARSE16)


def encode_delta(base: Buffer, target: Buffer, level: int = 3) -> bytes:
    """The sub32-zigzag-shuffle4-zstd delta that turns `base` into `target` (any lengths; the base is
    zero-padded or cut). `encode_smallest` picks among all codecs."""
    delta = _encode_dense(_SUB32, _bytes_of(base), _bytes_of(target), level=level, limit_bytes=None)
    assert delta is not None  # no limit: never abandoned
    return delta


def encode_smallest(base: Buffer, target: Buffer, *, level: int = 3) -> tuple[str, bytes]:
    """(codec name, delta bytes) of the smallest delta that turns `base` into `target`."""
    base_bytes, target_bytes = _bytes_of(base), _bytes_of(target)
    # The 16-bit difference feeds both sparse16 and sub16; sparse16 goes first: when few words
    # changed it is small and cheap, and every later candidate can stop once it is bigger.
    difference = _difference16(base_bytes, target_bytes)
    best_name, best = SPARSE16, _encode_sparse_difference(difference, target_bytes.size, level=level)
    for codec in (_SUB16, _SUB32):
        if _sampled_size_bytes(codec, base_bytes, target_bytes, level=level) > _SKIP_MARGIN * len(best):
            continue  # clearly bigger on a sample: not worth a full pass over the blob
        packed = _shuffled_zigzag(codec, difference if codec is _SUB16 else None, base_bytes, target_bytes)
        delta = _compress_dense(codec, packed, target_bytes.size, level=level, limit_bytes=len(best))
        if delta is not None and len(delta) < len(best):
            best_name, best = codec.name, delta
    return best_name, best


def encode_with(codec_name: str, base: Buffer, target: Buffer, *, level: int = 3) -> bytes:
    """The delta of one named codec (benchmarks and tests; the learner uses `encode_smallest`)."""
    base_bytes, target_bytes = _bytes_of(base), _bytes_of(target)
    if codec_name == SPARSE16:
        return _encode_sparse_difference(_difference16(base_bytes, target_bytes), target_bytes.size, level=level)
    for codec in _DENSE.values():
        if codec.name == codec_name:
            delta = _encode_dense(codec, base_bytes, target_bytes, level=level, limit_bytes=None)
            assert delta is not None
            return delta
    raise ValueError(f"unknown delta codec {codec_name!r}; known: {', '.join(CODECS)}")


def codec_of(delta: Buffer) -> str:
    """The codec name a delta payload carries in its magic."""
    magic = _magic_of(_bytes_of(delta))
    if magic == _SPARSE_MAGIC:
        return SPARSE16
    if magic in _DENSE:
        return _DENSE[magic].name
    raise DeltaError(f"unknown delta codec (magic {magic!r})")


def apply_delta(base: Buffer, delta: Buffer) -> bytes:
    """The target bytes the delta was made from, whichever codec made it."""
    base_bytes, delta_bytes = _bytes_of(base), _bytes_of(delta)
    magic = _magic_of(delta_bytes)
    if magic == _SPARSE_MAGIC:
        return _apply_sparse(base_bytes, delta_bytes)
    if magic in _DENSE:
        return _apply_dense(_DENSE[magic], base_bytes, delta_bytes)
    raise DeltaError(f"unknown delta codec (magic {magic!r})")


# --- dense: sub32 / sub16 --------------------------------------------------------------------------


def _encode_dense(
    codec: _Dense, base: np.ndarray, target: np.ndarray, *, level: int, limit_bytes: int | None
) -> bytes | None:
    packed = _shuffled_zigzag(codec, None, base, target)
    return _compress_dense(codec, packed, target.size, level=level, limit_bytes=limit_bytes)


def _shuffled_zigzag(codec: _Dense, difference: np.ndarray | None, base: np.ndarray, target: np.ndarray) -> np.ndarray:
    """shuffle(zigzag(target words - base words)) as (n * word_bytes,) uint8; `difference` if already made."""
    if difference is None:
        difference = _words(target, target.size, codec.unsigned) - _words(base, target.size, codec.unsigned)
    signed = difference.view(codec.signed)  # wrapped difference, read as signed
    zigzag = ((signed << 1) ^ (signed >> (8 * codec.word_bytes - 1))).view(codec.unsigned)  # small |d| -> small
    return _shuffle(zigzag, codec.word_bytes)


def _sampled_size_bytes(codec: _Dense, base: np.ndarray, target: np.ndarray, *, level: int) -> float:
    """The dense codec's size estimated from evenly spaced blocks of the blob; 0 (never skip) for a
    blob too small to sample or a base shorter than the target."""
    if target.size < _SAMPLE_MIN_BYTES or base.size < target.size:
        return 0.0
    block_bytes = min(_SAMPLE_BLOCK_BYTES, target.size // _SAMPLE_NUM_BLOCKS) // 4 * 4
    starts = np.linspace(0, target.size - block_bytes, _SAMPLE_NUM_BLOCKS).astype(np.int64) // 4 * 4
    base_sample = np.concatenate([base[start : start + block_bytes] for start in starts])
    target_sample = np.concatenate([target[start : start + block_bytes] for start in starts])
    packed = _shuffled_zigzag(codec, None, base_sample, target_sample)
    body = _compress(packed, level=level, limit_bytes=None)
    assert body is not None
    return len(body) * target.size / target_sample.size


def _compress_dense(
    codec: _Dense, packed: np.ndarray, target_size_bytes: int, *, level: int, limit_bytes: int | None
) -> bytes | None:
    body = _compress(packed, level=level, limit_bytes=limit_bytes)
    return None if body is None else _DENSE_HEADER.pack(codec.magic, target_size_bytes) + body


def _apply_dense(codec: _Dense, base: np.ndarray, delta: np.ndarray) -> bytes:
    if delta.size < _DENSE_HEADER.size:
        raise DeltaError(f"{codec.name} delta of {delta.size} bytes is shorter than its header")
    _, target_size_bytes = _DENSE_HEADER.unpack_from(delta.data)
    padded_size_bytes = _padded(target_size_bytes, codec.word_bytes)
    shuffled = _decompress(codec.name, delta[_DENSE_HEADER.size :], padded_size_bytes)
    zigzag = _unshuffle(shuffled, codec.word_bytes).view(codec.unsigned)
    difference = (zigzag >> 1) ^ (-(zigzag & 1)).astype(codec.unsigned)  # back to the wrapped difference
    target = _words(base, target_size_bytes, codec.unsigned) + difference
    return target.view(np.uint8)[:target_size_bytes].tobytes()


# --- sparse16 ---------------------------------------------------------------------------------------


def _difference16(base: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(n,) uint16: target words - base words, wrapped (the base zero-padded or cut to the target)."""
    return _words(target, target.size, np.uint16) - _words(base, target.size, np.uint16)


def _encode_sparse_difference(difference: np.ndarray, target_size_bytes: int, *, level: int) -> bytes:
    """sparse16 from the (n,) uint16 wrapped difference target - base."""
    positions = np.flatnonzero(difference)  # (k,) int64, ascending
    gaps = np.diff(positions, prepend=-1) - 1  # (k,) >= 0: 0 for the next word
    gap_dtype = _narrowest(int(gaps.max()) if gaps.size else 0)
    signed = difference[positions].view(np.int16)
    zigzag = ((signed << 1) ^ (signed >> 15)).view(np.uint16)
    gap_bytes = np.dtype(gap_dtype).itemsize
    packed = np.concatenate([_shuffle(gaps.astype(gap_dtype), gap_bytes), _shuffle(zigzag, 2)])
    header = _SPARSE_HEADER.pack(_SPARSE_MAGIC, target_size_bytes, positions.size, gap_bytes)
    body = _compress(packed, level=level, limit_bytes=None)
    assert body is not None
    return header + body


def _apply_sparse(base: np.ndarray, delta: np.ndarray) -> bytes:
    if delta.size < _SPARSE_HEADER.size:
        raise DeltaError(f"{SPARSE16} delta of {delta.size} bytes is shorter than its header")
    _, target_size_bytes, num_changed, gap_bytes = _SPARSE_HEADER.unpack_from(delta.data)
    num_words = _padded(target_size_bytes, 2) // 2
    gap_dtype = {np.dtype(dtype).itemsize: dtype for dtype in _GAP_DTYPES}.get(gap_bytes)
    if gap_dtype is None or num_changed > num_words:
        raise DeltaError(f"corrupt {SPARSE16} delta: {num_changed} changes of {num_words} words, gap width {gap_bytes}")
    packed = _decompress(SPARSE16, delta[_SPARSE_HEADER.size :], num_changed * (gap_bytes + 2))
    gaps = _unshuffle(packed[: num_changed * gap_bytes], gap_bytes).view(gap_dtype)
    zigzag = _unshuffle(packed[num_changed * gap_bytes :], 2).view(np.uint16)
    positions = np.cumsum(gaps.astype(np.uint64) + 1, dtype=np.uint64) - 1  # (k,) ascending
    if num_changed and int(positions.max()) >= num_words:  # max, not last: corrupt uint64 gaps may wrap
        raise DeltaError(f"corrupt {SPARSE16} delta: a change beyond the {num_words} words of the target")
    target = _words(base, target_size_bytes, np.uint16)
    target[positions] += (zigzag >> 1) ^ (-(zigzag & 1)).astype(np.uint16)  # positions are distinct
    return target.view(np.uint8)[:target_size_bytes].tobytes()


def _narrowest(max_value: int) -> type[np.unsignedinteger]:
    return next(dtype for dtype in _GAP_DTYPES if max_value <= np.iinfo(dtype).max)


# --- bytes, words, zstd -----------------------------------------------------------------------------


def _bytes_of(data: Buffer) -> np.ndarray:
    """Any C-contiguous buffer as a read-only (n,) uint8 array, without a copy."""
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def _magic_of(delta: np.ndarray) -> bytes:
    if delta.size < 4:
        raise DeltaError(f"delta of {delta.size} bytes is shorter than its header")
    return delta[:4].tobytes()


def _words(data: np.ndarray, num_bytes: int, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """The first `num_bytes` of `data` (zero-padded when shorter, then to whole words) as a new word array."""
    word_bytes = np.dtype(dtype).itemsize
    words = np.zeros(_padded(num_bytes, word_bytes) // word_bytes, dtype=dtype)
    count = min(data.size, num_bytes)
    words.view(np.uint8)[:count] = data[:count]
    return words


def _padded(num_bytes: int, word_bytes: int) -> int:
    return -(-num_bytes // word_bytes) * word_bytes


def _shuffle(words: np.ndarray, word_bytes: int) -> np.ndarray:
    """(n,) words -> (n * word_bytes,) uint8: byte 0 of every word, then byte 1, ..."""
    return np.ascontiguousarray(words.view(np.uint8).reshape(-1, word_bytes).T).reshape(-1)


def _unshuffle(data: np.ndarray, word_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(data.reshape(word_bytes, -1).T).reshape(-1)


def _compress(data: np.ndarray, *, level: int, limit_bytes: int | None) -> bytes | None:
    """zstd of `data`; None as soon as the output is sure to exceed `limit_bytes` (it only grows)."""
    threads = (os.cpu_count() or 1) if data.size >= _THREADS_MIN_BYTES else 0
    # the frame's checksum turns a corrupt payload into a DeltaError here, not into wrong weights later
    compressor = zstandard.ZstdCompressor(level=level, threads=threads, write_content_size=True, write_checksum=True)
    view = data.data  # a memoryview: slices without copies
    # Always streamed, so a candidate compresses to the same bytes whether or not it may be abandoned.
    stream = compressor.compressobj(size=data.size)
    pieces: list[bytes] = []
    num_out_bytes = 0
    for start in range(0, data.size, _STREAM_BYTES):
        pieces.append(stream.compress(view[start : start + _STREAM_BYTES]))
        num_out_bytes += len(pieces[-1])
        if limit_bytes is not None and num_out_bytes > limit_bytes:
            return None
    pieces.append(stream.flush())
    return b"".join(pieces)


def _decompress(codec_name: str, body: np.ndarray, size_bytes: int) -> np.ndarray:
    try:
        data = zstandard.ZstdDecompressor().decompress(body.data, max_output_size=max(1, size_bytes))
    except zstandard.ZstdError as exc:
        raise DeltaError(f"corrupt {codec_name} delta: {exc}") from exc
    if len(data) != size_bytes:
        raise DeltaError(f"corrupt {codec_name} delta: decodes to {len(data)} bytes, expected {size_bytes}")
    return np.frombuffer(data, dtype=np.uint8)
