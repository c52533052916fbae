import hashlib
import hmac
import json
import os
import re

import pytest

from shared.signing import generate_key_pair, key_id, load_public_key, load_signing_key, public_key_hex
from shared.signing import main as signing_cli
from shared.weight_channel import Manifest, ManifestError, verify_signature
from shared.weight_channel.manifest import (
    ChunkVerificationError,
    build_manifest,
    chunk_digest,
    payload_digest,
    sign,
    verify_chunk,
    verify_full_weights,
)
from tests.weights_keys import FORGER_KEY, PUBLIC_KEY, SIGNING_KEY


def test_chunks_are_views_of_the_blob_and_the_last_chunk_is_short() -> None:
    blob = os.urandom(10_000)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=4, chunk_size_bytes=4096, signing_key=SIGNING_KEY
    )
    assert manifest.num_chunks == 3 and [len(c) for c in chunks] == [4096, 4096, 1808]
    assert all(isinstance(chunk, memoryview) and chunk.obj is blob for chunk in chunks)  # no copy
    assert b"".join(chunks) == blob
    verify_full_weights(manifest, blob)
    verify_signature(manifest, PUBLIC_KEY)


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_the_payload_digest_is_derived_from_the_chunk_digests(algorithm: str) -> None:
    blob = os.urandom(9000)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=0, chunk_size_bytes=4096, signing_key=SIGNING_KEY, hash_algorithm=algorithm
    )
    assert manifest.hash_algorithm == algorithm
    digests = [chunk_digest(algorithm, chunk) for chunk in chunks]
    assert manifest.chunk_digests == digests
    if algorithm == "sha256":
        assert digests[0] == hashlib.sha256(blob[:4096]).hexdigest()
    assert manifest.digest == manifest.full_digest == payload_digest(algorithm, 9000, 4096, digests)
    # the sizes are bound in: the same chunk list under another size is another digest
    assert payload_digest(algorithm, 9001, 4096, digests) != manifest.digest
    # a manifest whose payload digest does not list its chunks is malformed, signed or not
    body = manifest.model_dump() | {"chunk_digests": [digests[0], digests[0], digests[2]]}
    with pytest.raises(ManifestError, match="not the payload digest"):
        Manifest.from_json(Manifest.model_construct(**body).model_dump_json())


def test_rebuilt_weights_are_checked_against_the_full_digest() -> None:
    blob = os.urandom(9000)
    manifest, _ = build_manifest(blob, run_id="r", policy_version=0, chunk_size_bytes=4096, signing_key=SIGNING_KEY)
    assert verify_full_weights(manifest, blob) == manifest.chunk_digests
    with pytest.raises(ChunkVerificationError, match="do not match full_digest"):
        verify_full_weights(manifest, blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(ChunkVerificationError, match="8999 bytes"):
        verify_full_weights(manifest, blob[:-1])


def test_a_flipped_byte_in_any_chunk_is_caught() -> None:
    manifest, chunks = build_manifest(
        os.urandom(9000), run_id="r", policy_version=0, chunk_size_bytes=4096, signing_key=SIGNING_KEY
    )
    corrupt = bytearray(chunks[1])
    corrupt[100] ^= 0xFF
    with pytest.raises(ChunkVerificationError, match="chunk 1: blake3"):
        verify_chunk(manifest, 1, bytes(corrupt))
    with pytest.raises(ChunkVerificationError, match="bytes, expected"):
        verify_chunk(manifest, 2, bytes(chunks[2]) + b"x")


def test_forged_tampered_or_unsigned_manifests_are_refused() -> None:
    manifest, _ = build_manifest(
        b"weights", run_id="r", policy_version=1, chunk_size_bytes=4096, signing_key=SIGNING_KEY
    )
    assert manifest.signing_key_id == key_id(PUBLIC_KEY) and len(manifest.signature) == 128
    # signed by another Ed25519 key (all a worker could do): the error names both keys
    forged = sign(manifest, FORGER_KEY)
    with pytest.raises(
        ManifestError,
        match=f"signed by key {key_id(FORGER_KEY.public_key())}, this receiver trusts key {key_id(PUBLIC_KEY)}",
    ):
        verify_signature(forged, PUBLIC_KEY)
    # ... and claiming the learner's key id does not help
    with pytest.raises(ManifestError, match="forged or corrupt"):
        verify_signature(forged.model_copy(update={"signing_key_id": manifest.signing_key_id}), PUBLIC_KEY)
    tampered = manifest.model_copy(update={"policy_version": 2})
    with pytest.raises(ManifestError, match="forged or corrupt"):
        verify_signature(tampered, PUBLIC_KEY)
    with pytest.raises(ManifestError, match="forged or corrupt"):
        verify_signature(manifest.model_copy(update={"chunk_digests": ["0" * 64]}), PUBLIC_KEY)
    with pytest.raises(ManifestError, match="unsigned"):
        verify_signature(manifest.model_copy(update={"signature": ""}), PUBLIC_KEY)
    verify_signature(sign(tampered, SIGNING_KEY), PUBLIC_KEY)


def test_old_manifests_are_refused_with_their_schema_version() -> None:
    manifest, _ = build_manifest(
        b"weights", run_id="r", policy_version=1, chunk_size_bytes=4096, signing_key=SIGNING_KEY
    )
    body = manifest.model_dump(mode="json", exclude={"signing_key_id"})
    body |= {"schema_version": 2, "signature": hmac.new(b"cluster-key", b"body", hashlib.sha256).hexdigest()}
    with pytest.raises(ManifestError, match="schema_version 2, this receiver accepts only 4.*HMAC"):
        Manifest.from_json(json.dumps(body))
    with pytest.raises(ManifestError, match="schema_version 3, this receiver accepts only 4.*second time"):
        Manifest.from_json(json.dumps(manifest.model_dump(mode="json") | {"schema_version": 3}))


def test_key_text_is_64_hex_characters_and_a_bad_one_is_not_echoed() -> None:
    pair = generate_key_pair()
    assert re.fullmatch("[0-9a-f]{64}", pair.signing_key_hex) and re.fullmatch("[0-9a-f]{64}", pair.public_key_hex)
    assert pair.signing_key_hex not in repr(pair)
    assert public_key_hex(load_signing_key(pair.signing_key_hex).public_key()) == pair.public_key_hex
    assert key_id(load_public_key(pair.public_key_hex)) == pair.key_id != key_id(PUBLIC_KEY)
    with pytest.raises(ValueError, match="RL_SIGNING_KEY must be the hex of a raw 32-byte Ed25519 key") as caught:
        load_signing_key("secret-ish" + pair.signing_key_hex[:40])
    assert pair.signing_key_hex[:40] not in str(caught.value)
    with pytest.raises(ValueError, match="RL_WEIGHTS_PUBLIC_KEY"):
        load_public_key(pair.public_key_hex + "00")


def test_generate_prints_a_matching_pair_as_env_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert signing_cli(["generate"]) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) == {"RL_SIGNING_KEY", "RL_WEIGHTS_PUBLIC_KEY"}
    signed = sign(
        build_manifest(b"w", run_id="r", policy_version=0, chunk_size_bytes=8, signing_key=SIGNING_KEY)[0],
        load_signing_key(lines["RL_SIGNING_KEY"]),
    )
    verify_signature(signed, load_public_key(lines["RL_WEIGHTS_PUBLIC_KEY"]))


def test_manifest_json_round_trip_and_malformed_json() -> None:
    manifest, _ = build_manifest(
        b"x" * 5000, run_id="r", policy_version=1, chunk_size_bytes=1024, signing_key=SIGNING_KEY
    )
    assert Manifest.from_json(manifest.to_json()) == manifest
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.from_json(b'{"policy_version": "one"}')
    body = manifest.model_dump()
    body["chunk_digests"] = body["chunk_digests"][:2]
    with pytest.raises(ManifestError, match="chunk digests"):
        Manifest.from_json(Manifest.model_construct(**body).model_dump_json())
