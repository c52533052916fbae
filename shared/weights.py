"""Weight chunking: a policy version's bytes, split into fixed-size chunks, described by a signed
manifest (version, sizes, the sha256 of every chunk and of the whole blob).

A version travels as one of two payloads (an "artifact" is one version in one payload):
  full   the safetensors bytes of the state dict
  delta  `shared.delta` bytes that turn the full bytes of `base_version` into this version's
Both say `full_size_bytes` and `full_sha256` of the weights they stand for, so the weights a worker
reconstructs from a delta are checked against the same hash as a full download; a delta also names
its base by hash (`base_sha256`), so it is never applied to other bytes that share the version number
(a restarted learner re-uses numbers).

A receiver verifies every chunk against the manifest before it stores, relays or loads it, and the
manifest's Ed25519 signature against the learner's public key before it trusts any of it. Only the
learner holds the private key (shared.signing): a worker can check the weights it relays but cannot
sign any of its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Literal, Self, cast

from cryptography.exceptions import InvalidSignature
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.signing import Ed25519PrivateKey, Ed25519PublicKey, key_id


class WeightsError(RuntimeError):
    """Base of everything that makes a version unusable: the caller must not load it."""


class ManifestError(WeightsError):
    """The manifest is malformed, of an old schema, unsigned, signed by another key than the trusted
    one, or its signature does not match its body."""


class ChunkVerificationError(WeightsError):
    """A chunk (or the reassembled blob) does not hash to what the manifest says."""


class ModelMismatchError(WeightsError):
    """The weights were published for another model folder (tokenizer or architecture): loading them
    would sample garbage or fail. Permanent for that manifest: the receiver does not retry it."""


Payload = Literal["full", "delta"]


def as_payload(text: str) -> Payload:
    """`text` ("full" or "delta") as a Payload; ValueError for anything else."""
    if text not in ("full", "delta"):
        raise ValueError(f"payload must be 'full' or 'delta', not {text!r}")
    return cast(Payload, text)


SHA256_PATTERN = r"^[0-9a-f]{64}$"
MANIFEST_SCHEMA_VERSION: Literal[3] = 3  # 3: Ed25519 under the learner's key; 2 was HMAC under a key every worker held


class Manifest(BaseModel):
    """Describes one published artifact (a policy version as a full or delta payload).
    Producer: learner. Consumers: chunk servers, workers. Every field is covered by the signature."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_version: Literal[3] = MANIFEST_SCHEMA_VERSION
    run_id: str = Field(min_length=1)
    policy_version: int = Field(ge=0)
    format: Literal["safetensors"] = "safetensors"
    payload: Payload = Field(
        "full", description="full: the safetensors bytes; delta: shared.delta bytes against base_version"
    )
    total_size_bytes: int = Field(ge=0, description="bytes of this payload")
    chunk_size_bytes: int = Field(ge=1)
    chunk_sha256: list[str]
    blob_sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of this payload's bytes")
    full_size_bytes: int = Field(ge=0, description="bytes of the full weights this payload stands for")
    full_sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the full weights (after applying a delta)")
    base_version: int = Field(-1, ge=-1, description="delta: the version it applies to; -1 for a full payload")
    base_sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$", description="delta: full_sha256 of that base version")
    codec: str = Field("", max_length=64, description="delta: the shared.delta codec")
    model_fingerprint: str = Field(
        "",
        pattern=r"^([0-9a-f]{64})?$",
        description="shared.tokenization.model_fingerprint of the learner's folder (tokenizer + architecture); empty: unknown",
    )
    created_at_s: float
    signing_key_id: str = Field(
        "",
        pattern=r"^([0-9a-f]{16})?$",
        description="shared.signing.key_id of the public key that verifies the signature; empty: unsigned",
    )
    signature: str = Field(
        "",
        pattern=r"^([0-9a-f]{128})?$",
        description="hex Ed25519 signature of the canonical body (every other field) by the learner's private key",
    )

    @model_validator(mode="before")
    @classmethod
    def _current_schema(cls, data: Any) -> Any:
        schema_version = data.get("schema_version", MANIFEST_SCHEMA_VERSION) if isinstance(data, dict) else None
        if schema_version != MANIFEST_SCHEMA_VERSION and schema_version is not None:
            raise ValueError(
                f"manifest schema_version {schema_version!r}, this receiver accepts only {MANIFEST_SCHEMA_VERSION} "
                "(Ed25519-signed by the learner's RL_SIGNING_KEY); version 2 manifests were HMAC-signed with the "
                "shared RL_CLUSTER_KEY, which any worker held, and are no longer trusted: upgrade the learner"
            )
        return data

    @model_validator(mode="after")
    def _chunk_count_matches_size(self) -> Self:
        expected = -(-self.total_size_bytes // self.chunk_size_bytes)
        if len(self.chunk_sha256) != expected:
            raise ValueError(
                f"{len(self.chunk_sha256)} chunk hashes for {self.total_size_bytes} bytes in chunks of {self.chunk_size_bytes}"
            )
        return self

    @model_validator(mode="after")
    def _payload_fields_agree(self) -> Self:
        if self.payload == "full":
            if (self.full_size_bytes, self.full_sha256) != (self.total_size_bytes, self.blob_sha256):
                raise ValueError(
                    "a full payload must describe itself: full_size_bytes/full_sha256 != total_size_bytes/blob_sha256"
                )
            if self.base_version != -1 or self.base_sha256 or self.codec:
                raise ValueError("a full payload has no base_version, base_sha256 or codec")
        elif self.base_version < 0 or not self.base_sha256 or not self.codec:
            raise ValueError("a delta payload needs base_version, base_sha256 and codec")
        return self

    @property
    def artifact(self) -> str:
        """`<version>/<payload>`: what a chunk server's routes and logs call this manifest."""
        return f"{self.policy_version}/{self.payload}"

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_sha256)

    def chunk_length(self, index: int) -> int:
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} of a {self.num_chunks}-chunk version")
        return min(self.chunk_size_bytes, self.total_size_bytes - index * self.chunk_size_bytes)

    def body_bytes(self) -> bytes:
        """Canonical bytes that the signature covers: every field except the signature (the key id too)."""
        body = self.model_dump(mode="json", exclude={"signature"})
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    def sha256(self) -> str:
        return hashlib.sha256(self.to_json()).hexdigest()

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise ManifestError(f"malformed manifest: {exc}") from exc


def split_into_chunks(blob: bytes, chunk_size_bytes: int) -> list[bytes]:
    if chunk_size_bytes < 1:
        raise ValueError(f"chunk_size_bytes must be positive, got {chunk_size_bytes}")
    return [blob[i : i + chunk_size_bytes] for i in range(0, len(blob), chunk_size_bytes)]


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def sign(manifest: Manifest, signing_key: Ed25519PrivateKey) -> Manifest:
    """`manifest` signed by the learner's private key: its key id set, then the body signed."""
    keyed = manifest.model_copy(update={"signing_key_id": key_id(signing_key.public_key()), "signature": ""})
    return keyed.model_copy(update={"signature": signing_key.sign(keyed.body_bytes()).hex()})


def verify_signature(manifest: Manifest, public_key: Ed25519PublicKey) -> None:
    """Raise ManifestError unless the manifest carries a valid signature by the holder of the private
    key that goes with `public_key` (the learner's)."""
    if not manifest.signature:
        raise ManifestError(f"manifest of version {manifest.artifact} is unsigned")
    trusted_id = key_id(public_key)
    if manifest.signing_key_id != trusted_id:
        raise ManifestError(
            f"manifest of version {manifest.artifact} is signed by key {manifest.signing_key_id or '(none)'}, "
            f"this receiver trusts key {trusted_id} (RL_WEIGHTS_PUBLIC_KEY): either it is not the learner's "
            "manifest or the learner's RL_SIGNING_KEY and this RL_WEIGHTS_PUBLIC_KEY are not a pair"
        )
    try:
        public_key.verify(bytes.fromhex(manifest.signature), manifest.body_bytes())
    except InvalidSignature:
        raise ManifestError(
            f"manifest of version {manifest.artifact} has a forged or corrupt signature "
            f"(its body was changed after signing, or key {trusted_id} did not sign it)"
        ) from None


def build_manifest(
    blob: bytes,
    *,
    run_id: str,
    policy_version: int,
    chunk_size_bytes: int,
    signing_key: Ed25519PrivateKey,
    model_fingerprint: str = "",
) -> tuple[Manifest, list[bytes]]:
    """Chunk the full weights `blob` and describe them; returns the signed manifest and the chunks in order."""
    chunks = split_into_chunks(blob, chunk_size_bytes)
    blob_sha256 = sha256_hex(blob)
    manifest = Manifest(
        run_id=run_id,
        policy_version=policy_version,
        total_size_bytes=len(blob),
        chunk_size_bytes=chunk_size_bytes,
        chunk_sha256=[sha256_hex(chunk) for chunk in chunks],
        blob_sha256=blob_sha256,
        full_size_bytes=len(blob),
        full_sha256=blob_sha256,
        model_fingerprint=model_fingerprint,
        created_at_s=time.time(),
    )
    return sign(manifest, signing_key), chunks


def build_delta_manifest(
    delta: bytes, *, full: Manifest, base: Manifest, codec: str, signing_key: Ed25519PrivateKey
) -> tuple[Manifest, list[bytes]]:
    """Chunk `delta` (which turns `base`'s full weights into `full`'s) and describe it, signed."""
    if full.payload != "full" or base.payload != "full":
        raise ValueError(f"a delta is described by two full manifests, got {full.artifact} and {base.artifact}")
    chunks = split_into_chunks(delta, full.chunk_size_bytes)
    manifest = Manifest(
        run_id=full.run_id,
        policy_version=full.policy_version,
        payload="delta",
        total_size_bytes=len(delta),
        chunk_size_bytes=full.chunk_size_bytes,
        chunk_sha256=[sha256_hex(chunk) for chunk in chunks],
        blob_sha256=sha256_hex(delta),
        full_size_bytes=full.full_size_bytes,
        full_sha256=full.full_sha256,
        base_version=base.policy_version,
        base_sha256=base.full_sha256,
        codec=codec,
        model_fingerprint=full.model_fingerprint,
        created_at_s=time.time(),
    )
    return sign(manifest, signing_key), chunks


def check_model_fingerprint(manifest: Manifest, own_fingerprint: str) -> None:
    """Raise ModelMismatchError if the manifest was published for another model folder than the
    receiver's (both fingerprints known and different)."""
    if manifest.model_fingerprint and own_fingerprint and manifest.model_fingerprint != own_fingerprint:
        raise ModelMismatchError(
            f"version {manifest.artifact} was published for model fingerprint {manifest.model_fingerprint[:12]}.., "
            f"this folder's is {own_fingerprint[:12]}..: the learner and this worker use different tokenizers or "
            "architectures (point both at the same model folder)"
        )


def verify_chunk(manifest: Manifest, index: int, data: bytes | memoryview) -> None:
    """Raise ChunkVerificationError unless `data` is exactly chunk `index` of the manifest."""
    expected_length = manifest.chunk_length(index)
    if len(data) != expected_length:
        raise ChunkVerificationError(
            f"version {manifest.artifact} chunk {index}: {len(data)} bytes, expected {expected_length}"
        )
    digest = sha256_hex(data)
    if digest != manifest.chunk_sha256[index]:
        raise ChunkVerificationError(
            f"version {manifest.artifact} chunk {index}: sha256 {digest[:12]}.. != manifest {manifest.chunk_sha256[index][:12]}.."
        )


def assemble(manifest: Manifest, chunks: list[bytes]) -> bytes:
    """Join verified chunks and check the whole blob's hash; raises on any mismatch."""
    if len(chunks) != manifest.num_chunks:
        raise ChunkVerificationError(f"version {manifest.artifact}: {len(chunks)} of {manifest.num_chunks} chunks")
    for index, chunk in enumerate(chunks):
        verify_chunk(manifest, index, chunk)
    blob = b"".join(chunks)
    if sha256_hex(blob) != manifest.blob_sha256:
        raise ChunkVerificationError(f"version {manifest.artifact}: blob sha256 mismatch")
    return blob
