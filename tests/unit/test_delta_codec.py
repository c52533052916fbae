"""Delta payloads (shared/weight_channel/delta.py) and their signed manifests (shared/weight_channel/manifest.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shared.weight_channel.delta as delta_module
from shared.weight_channel import ManifestError, verify_signature
from shared.weight_channel.delta import (
    CODEC,
    CODECS,
    SPARSE16,
    SUB16,
    DeltaError,
    apply_delta,
    codec_of,
    encode_delta,
    encode_smallest,
    encode_with,
)
from shared.weight_channel.manifest import build_delta_manifest, build_manifest, sha256_hex, sign
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY


def noise(num_bytes: int, seed: int) -> bytes:
    """Random bytes, seeded: the parameters of a test are the same in every collection (and test ids too)."""
    return np.random.default_rng(seed).bytes(num_bytes)


def float_weights(seed: int, num_floats: int = 50_000) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(num_floats) * 0.05).astype(np.float32)


def one_step_later(weights: np.ndarray, step: float = 1e-3) -> np.ndarray:
    """What one Adam step does to float32 weights: most move by about `step`, frozen ones not at all."""
    rng = np.random.default_rng(1)
    moved = rng.random(weights.shape) < 0.9
    return (weights + step * np.sign(rng.standard_normal(weights.shape)) * moved).astype(np.float32)


def test_a_delta_rebuilds_the_target_bit_for_bit_and_is_much_smaller_for_one_optimizer_step() -> None:
    header = b"{" + b"x" * 61 + b"}\x00\x00"  # a safetensors-like header in front: 8-byte aligned data
    base = header + float_weights(0).tobytes()
    target = header + one_step_later(float_weights(0)).tobytes()

    delta = encode_delta(base, target)

    assert apply_delta(base, delta) == target
    assert len(delta) < 0.6 * len(target)  # ~0.41 on this data; plain zstd of the target saves ~8%


@pytest.mark.parametrize(
    ("base", "target"),
    [
        (b"", b""),
        (b"abc", b"abcdefg"),  # target longer than the base
        (b"abcdefghij", b"xy"),  # shorter
        (noise(1001, 101), noise(999, 102)),  # unrelated, not whole words
        (b"", noise(10, 103)),
        (
            np.array([np.nan, np.inf, -0.0], dtype=np.float32).tobytes(),
            np.array([1.0, -np.inf, 0.0], dtype=np.float32).tobytes(),
        ),
    ],
)
def test_any_bytes_round_trip(base: bytes, target: bytes) -> None:
    assert apply_delta(base, encode_delta(base, target)) == target


def bf16_words(weights: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (round to nearest even), as the learner's bf16 weights are stored."""
    bits = weights.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_step(seed: int = 0, num_weights: int = 40_000, step: float = 1e-5) -> tuple[bytes, bytes]:
    """bf16 weights before and after an Adam-like step of `step`: most words stay, a few move one ulp."""
    weights = float_weights(seed, num_weights)
    moved = weights + step * np.sign(np.random.default_rng(seed + 1).standard_normal(num_weights))
    return bf16_words(weights).tobytes(), bf16_words(moved).tobytes()


NAN_PATTERNS = (
    np.array([np.nan, np.inf, -0.0, -np.nan, 1.0], dtype=np.float32).tobytes() + b"\x01\x80\xc0\x7f",
    np.array([1.0, -np.inf, 0.0, np.nan, np.nan], dtype=np.float32).tobytes() + b"\xc1\xff\x80\x7f",
)
ROUND_TRIP_CASES = [
    (b"", b""),
    (b"abc", b"abcdefg"),  # target longer than the base, odd lengths
    (b"abcdefghij", b"xy"),  # shorter
    (noise(1001, 104), noise(999, 105)),  # unrelated, not whole words of 2 or 4 bytes
    (noise(1002, 106), noise(1003, 107)),
    (b"", noise(10, 108)),
    (noise(10, 109), b""),
    NAN_PATTERNS,
    (NAN_PATTERNS[0], NAN_PATTERNS[0][:-1] + b"\xff"),  # only the last byte of an odd length changes
    bf16_step(),
]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("base", "target"), ROUND_TRIP_CASES)
def test_every_codec_rebuilds_any_bytes_bit_for_bit(codec: str, base: bytes, target: bytes) -> None:
    delta = encode_with(codec, base, target)
    assert codec_of(delta) == codec
    assert apply_delta(base, delta) == target
    # the callers pass memoryviews of mmaps: no bytes methods, and any item format
    assert apply_delta(memoryview(base), memoryview(delta)) == target
    assert apply_delta(memoryview(bytearray(base)), memoryview(bytearray(delta))) == target


def test_inputs_may_be_memoryviews_of_any_format() -> None:
    base, target = float_weights(0), one_step_later(float_weights(0))
    name, delta = encode_smallest(memoryview(base), memoryview(target))  # format "f", not bytes
    assert apply_delta(memoryview(base), delta) == target.tobytes()
    assert codec_of(memoryview(delta)) == name
    assert encode_delta(memoryview(base), memoryview(target)) == encode_delta(base.tobytes(), target.tobytes())


@pytest.mark.parametrize("codec", CODECS)
def test_an_unchanged_target_is_a_tiny_delta(codec: str) -> None:
    base = bf16_step()[0]
    delta = encode_with(codec, base, base)
    assert len(delta) < 200 < len(base) // 100
    assert apply_delta(base, delta) == base


@pytest.mark.parametrize("codec", CODECS)
def test_a_fully_changed_target_round_trips(codec: str) -> None:
    base = os.urandom(30_001)
    target = bytes(byte ^ 0xFF for byte in base)  # every byte, hence every word, differs
    delta = encode_with(codec, base, target)
    assert apply_delta(base, delta) == target
    assert len(delta) < 1.1 * len(target) + 100  # incompressible, but not blown up


@pytest.mark.parametrize(
    ("base", "target"),
    [
        bf16_step(),  # few bf16 words move: sparse16 should be the one
        bf16_step(step=3e-4),  # most move
        (float_weights(0).tobytes(), one_step_later(float_weights(0)).tobytes()),  # float32 words
        (noise(5000, 110), noise(5000, 111)),
    ],
)
def test_encode_smallest_picks_the_smallest_codec(base: bytes, target: bytes) -> None:
    name, delta = encode_smallest(base, target)
    sizes = {codec: len(encode_with(codec, base, target)) for codec in CODECS}
    assert len(delta) == min(sizes.values()) == sizes[name]
    assert codec_of(delta) == name and apply_delta(base, delta) == target


@pytest.mark.parametrize(
    ("base", "target"),
    [bf16_step(), bf16_step(step=3e-4), (float_weights(0).tobytes(), one_step_later(float_weights(0)).tobytes())],
)
def test_the_sampled_estimate_skips_only_candidates_that_lose(
    base: bytes, target: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = encode_smallest(base, target)
    monkeypatch.setattr(delta_module, "_SAMPLE_MIN_BYTES", 0)  # sample these small blobs as if they were big
    assert encode_smallest(base, target) == exact


def test_sparse16_is_the_smaller_when_few_bf16_words_change() -> None:
    base, target = bf16_step()
    changed = np.frombuffer(base, np.uint16) != np.frombuffer(target, np.uint16)
    assert 0.0 < changed.mean() < 0.3  # the premise: most bf16 words did not move
    sparse, sub16 = encode_with(SPARSE16, base, target), encode_with(SUB16, base, target)
    assert len(sparse) < len(sub16) < len(encode_delta(base, target))
    assert encode_smallest(base, target)[0] == SPARSE16


def test_an_unknown_codec_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown delta codec"):
        encode_with("xor-zstd", b"a", b"b")


@pytest.mark.parametrize("codec", CODECS)
def test_a_corrupt_or_truncated_delta_is_caught_by_every_codec(codec: str) -> None:
    base, target = bf16_step()
    delta = encode_with(codec, base, target)
    for broken in (delta[:-20], delta[: len(delta) // 2], delta[:14], delta[:6], delta[:3]):
        with pytest.raises(DeltaError):
            apply_delta(base, broken)
    body_at = len(delta) // 2  # inside the zstd frame
    flipped = bytearray(delta)
    flipped[body_at] ^= 0xFF
    with pytest.raises(DeltaError, match="corrupt"):  # a flipped byte: the zstd frame's checksum
        apply_delta(base, bytes(flipped))
    for junk in (b"XXXX" + delta[4:], b"RL"):
        with pytest.raises(DeltaError):
            codec_of(junk)
        with pytest.raises(DeltaError):
            apply_delta(base, junk)


def test_a_sparse16_delta_cannot_write_outside_its_target() -> None:
    base, target = bf16_step()
    delta = encode_with(SPARSE16, base, target)
    shrunk = delta[:4] + (100).to_bytes(8, "little") + delta[12:]  # target size cut to 100 bytes
    with pytest.raises(DeltaError, match="corrupt"):
        apply_delta(base, shrunk)


def test_a_broken_delta_or_the_wrong_base_is_caught() -> None:
    base, target = float_weights(0).tobytes(), one_step_later(float_weights(0)).tobytes()
    delta = encode_delta(base, target)
    with pytest.raises(DeltaError, match="magic"):
        apply_delta(base, b"XXXX" + delta[4:])
    with pytest.raises(DeltaError, match="corrupt"):
        apply_delta(base, delta[:-50])
    with pytest.raises(DeltaError, match="shorter"):
        apply_delta(base, b"RL")
    # the wrong base decodes, to the wrong bytes: the manifest's full_digest is what catches it
    assert sha256_hex(apply_delta(float_weights(7).tobytes(), delta)) != sha256_hex(target)


def test_a_delta_manifest_is_signed_names_its_base_and_the_full_weights() -> None:
    base_blob, target_blob = float_weights(0).tobytes(), one_step_later(float_weights(0)).tobytes()
    base, _ = build_manifest(base_blob, run_id="r", policy_version=4, chunk_size_bytes=4096, signing_key=SIGNING_KEY)
    full, _ = build_manifest(target_blob, run_id="r", policy_version=5, chunk_size_bytes=4096, signing_key=SIGNING_KEY)
    delta = encode_delta(base_blob, target_blob)

    manifest, chunks = build_delta_manifest(delta, full=full, base=base, codec=CODEC, signing_key=SIGNING_KEY)

    verify_signature(manifest, PUBLIC_KEY)
    assert (manifest.payload, manifest.artifact, manifest.base_version) == ("delta", "5/delta", 4)
    assert manifest.base_digest == base.full_digest and manifest.full_digest == full.digest
    assert manifest.total_size_bytes == len(delta) < manifest.full_size_bytes == len(target_blob)
    assert b"".join(chunks) == delta and full.full_digest == full.digest
    # pointing a delta at another base (or other full weights) breaks the signature
    with pytest.raises(ManifestError, match="forged"):
        verify_signature(manifest.model_copy(update={"base_digest": "0" * 64}), PUBLIC_KEY)
    with pytest.raises(ManifestError, match="forged"):
        verify_signature(manifest.model_copy(update={"full_digest": "1" * 64}), PUBLIC_KEY)
    verify_signature(sign(manifest.model_copy(update={"base_version": 3}), SIGNING_KEY), PUBLIC_KEY)


def test_a_manifest_must_be_consistent_about_its_payload() -> None:
    full, _ = build_manifest(b"w" * 100, run_id="r", policy_version=1, chunk_size_bytes=64, signing_key=SIGNING_KEY)
    body = full.model_dump()
    with pytest.raises(ValueError, match="describe itself"):
        type(full).model_validate({**body, "full_digest": "2" * 64})
    with pytest.raises(ValueError, match="needs base_version"):
        type(full).model_validate({**body, "payload": "delta"})
