"""Delta versions: policy version v as the difference from a base version, compressed.

    words  = the bytes as little-endian uint32 words (zero-padded to whole words)
    delta  = zstd(shuffle4(zigzag(words_v - words_base)))   # codec "sub32-zigzag-shuffle4-zstd"
    full_v = words_base + unzigzag(unshuffle4(unzstd(delta)))  (mod 2**32)

Why this shape: one optimizer step moves most float32 weights by a tiny amount, so sign and exponent
stay put and the integer difference of the two bit patterns is a small number, positive or negative.
Zigzag maps small negatives to small positives (-1 -> 1, 1 -> 2), so the high bytes of every word are
zero; grouping byte 0 of every word, then byte 1, ... (the "shuffle" of blosc and HDF5) puts those
zeros next to each other, where zstd finds them. On float32 weights after one Adam step this is
about a third smaller than XOR + shuffle (XOR flips every mantissa bit a carry crosses). Tensors that
did not change (frozen embedding rows, the safetensors header) difference to long zero runs.

Exact by construction: wrapping uint32 addition undoes wrapping subtraction bit for bit, whatever the
bytes are (the safetensors header, NaNs, anything). The caller still checks the result against the
manifest's `full_digest` before loading it. float32 is the word: safetensors aligns tensor data to 8
bytes, so words line up with floats; bf16 weights would still round-trip exactly, just compress less.

No torch here: this runs on the learner and on every worker, on raw safetensors bytes.
"""

from __future__ import annotations

import struct

import numpy as np
import zstandard

from shared.weights import Buffer

CODEC = "sub32-zigzag-shuffle4-zstd"
WORD_BYTES = 4
_MAGIC = b"RLD2"
_HEADER = struct.Struct("<4sQ")  # magic, length of the full target in bytes


class DeltaError(ValueError):
    """A delta payload that cannot be decoded (wrong codec, truncated, or not for this base)."""


def encode_delta(base: Buffer, target: Buffer, level: int = 3) -> bytes:
    """The delta that turns `base` into `target` (any lengths; the base is zero-padded or cut)."""
    difference = _words(target, len(target)) - _words(base, len(target))  # wraps mod 2**32
    signed = difference.view(np.int32)
    zigzag = ((signed << 1) ^ (signed >> 31)).view(np.uint32)  # small |d| -> small unsigned
    compressor = zstandard.ZstdCompressor(level=level)
    return _HEADER.pack(_MAGIC, len(target)) + compressor.compress(_shuffle(zigzag))


def apply_delta(base: Buffer, delta: Buffer) -> bytes:
    """The target bytes `encode_delta(base, target)` was made from."""
    if len(delta) < _HEADER.size:
        raise DeltaError(f"delta of {len(delta)} bytes is shorter than its header")
    magic, target_size_bytes = _HEADER.unpack_from(delta)
    if magic != _MAGIC:
        raise DeltaError(f"not a {CODEC} delta (magic {magic!r})")
    padded_size_bytes = _padded(target_size_bytes)
    try:
        shuffled = zstandard.ZstdDecompressor().decompress(delta[_HEADER.size :], max_output_size=padded_size_bytes)
    except zstandard.ZstdError as exc:
        raise DeltaError(f"corrupt {CODEC} delta: {exc}") from exc
    if len(shuffled) != padded_size_bytes:
        raise DeltaError(f"delta decodes to {len(shuffled)} bytes, expected {padded_size_bytes}")
    zigzag = _unshuffle(np.frombuffer(shuffled, dtype=np.uint8)).view(np.uint32)
    difference = (zigzag >> 1) ^ (-(zigzag & 1)).astype(np.uint32)  # back to the wrapped difference
    target = _words(base, target_size_bytes) + difference
    return target.view(np.uint8)[:target_size_bytes].tobytes()


def _words(data: Buffer, num_bytes: int) -> np.ndarray:
    """The first `num_bytes` of `data` (zero-padded when shorter, then to whole words) as uint32 words."""
    words = np.zeros(_padded(num_bytes) // WORD_BYTES, dtype=np.uint32)
    count = min(len(data), num_bytes)
    words.view(np.uint8)[:count] = np.frombuffer(data, dtype=np.uint8, count=count)
    return words


def _padded(num_bytes: int) -> int:
    return -(-num_bytes // WORD_BYTES) * WORD_BYTES


def _shuffle(words: np.ndarray) -> bytes:
    """(n,) words -> byte 0 of every word, then byte 1, ..."""
    return words.view(np.uint8).reshape(-1, WORD_BYTES).T.tobytes()


def _unshuffle(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data.reshape(WORD_BYTES, -1).T).reshape(-1)
