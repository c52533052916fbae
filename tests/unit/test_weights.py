import os

import pytest

from shared.weights import (
    ChunkVerificationError,
    Manifest,
    ManifestError,
    assemble,
    build_manifest,
    sign,
    verify_chunk,
    verify_signature,
)

KEY = b"cluster-key"


def test_chunks_reassemble_to_the_blob_and_the_last_chunk_is_short() -> None:
    blob = os.urandom(10_000)
    manifest, chunks = build_manifest(blob, run_id="r", policy_version=4, chunk_size_bytes=4096, cluster_key=KEY)
    assert manifest.num_chunks == 3 and [len(c) for c in chunks] == [4096, 4096, 1808]
    assert assemble(manifest, chunks) == blob
    verify_signature(manifest, KEY)


def test_a_flipped_byte_in_any_chunk_is_caught() -> None:
    manifest, chunks = build_manifest(
        os.urandom(9000), run_id="r", policy_version=0, chunk_size_bytes=4096, cluster_key=KEY
    )
    corrupt = bytearray(chunks[1])
    corrupt[100] ^= 0xFF
    with pytest.raises(ChunkVerificationError, match="chunk 1: sha256"):
        verify_chunk(manifest, 1, bytes(corrupt))
    with pytest.raises(ChunkVerificationError, match="bytes, expected"):
        verify_chunk(manifest, 2, chunks[2] + b"x")
    with pytest.raises(ChunkVerificationError):
        assemble(manifest, [chunks[0], bytes(corrupt), chunks[2]])


def test_forged_or_unsigned_manifests_are_refused() -> None:
    manifest, _ = build_manifest(b"weights", run_id="r", policy_version=1, chunk_size_bytes=4096, cluster_key=KEY)
    with pytest.raises(ManifestError, match="forged"):
        verify_signature(manifest, b"another-key")
    tampered = manifest.model_copy(update={"policy_version": 2})
    with pytest.raises(ManifestError, match="forged"):
        verify_signature(tampered, KEY)
    with pytest.raises(ManifestError, match="unsigned"):
        verify_signature(manifest.model_copy(update={"signature": ""}), KEY)
    verify_signature(sign(tampered, KEY), KEY)


def test_manifest_json_round_trip_and_malformed_json() -> None:
    manifest, _ = build_manifest(b"x" * 5000, run_id="r", policy_version=1, chunk_size_bytes=1024, cluster_key=KEY)
    assert Manifest.from_json(manifest.to_json()) == manifest
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.from_json(b'{"policy_version": "one"}')
    body = manifest.model_dump()
    body["chunk_sha256"] = body["chunk_sha256"][:2]
    with pytest.raises(ManifestError, match="chunk hashes"):
        Manifest.from_json(Manifest.model_construct(**body).model_dump_json())
