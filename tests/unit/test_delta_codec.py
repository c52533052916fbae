"""Delta payloads (shared/delta.py) and their signed manifests (shared/weights.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from shared.delta import CODEC, DeltaError, apply_delta, encode_delta
from shared.weights import ManifestError, build_delta_manifest, build_manifest, sha256_hex, sign, verify_signature
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY


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
        (os.urandom(1001), os.urandom(999)),  # unrelated, not whole words
        (b"", os.urandom(10)),
        (
            np.array([np.nan, np.inf, -0.0], dtype=np.float32).tobytes(),
            np.array([1.0, -np.inf, 0.0], dtype=np.float32).tobytes(),
        ),
    ],
)
def test_any_bytes_round_trip(base: bytes, target: bytes) -> None:
    assert apply_delta(base, encode_delta(base, target)) == target


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
