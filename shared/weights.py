"""Weight chunking: a policy version's safetensors bytes, split into fixed-size chunks, described by a
signed manifest (version, sizes, the sha256 of every chunk and of the whole blob).

A receiver verifies every chunk against the manifest before it stores, relays or loads it, and the
manifest's signature against the cluster key before it trusts any of it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class WeightsError(RuntimeError):
    """Base of everything that makes a version unusable: the caller must not load it."""


class ManifestError(WeightsError):
    """The manifest is malformed, unsigned, or its signature does not match the cluster key."""


class ChunkVerificationError(WeightsError):
    """A chunk (or the reassembled blob) does not hash to what the manifest says."""


class Manifest(BaseModel):
    """Describes one published policy version. Producer: learner. Consumers: chunk servers, workers."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    run_id: str = Field(min_length=1)
    policy_version: int = Field(ge=0)
    format: Literal["safetensors"] = "safetensors"
    total_size_bytes: int = Field(ge=0)
    chunk_size_bytes: int = Field(ge=1)
    chunk_sha256: list[str]
    blob_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at_s: float
    signature: str = Field("", description="hex HMAC-SHA256 of the canonical manifest body under the cluster key")

    @model_validator(mode="after")
    def _chunk_count_matches_size(self) -> Self:
        expected = -(-self.total_size_bytes // self.chunk_size_bytes)
        if len(self.chunk_sha256) != expected:
            raise ValueError(f"{len(self.chunk_sha256)} chunk hashes for {self.total_size_bytes} bytes in chunks of {self.chunk_size_bytes}")
        return self

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_sha256)

    def chunk_length(self, index: int) -> int:
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} of a {self.num_chunks}-chunk version")
        return min(self.chunk_size_bytes, self.total_size_bytes - index * self.chunk_size_bytes)

    def body_bytes(self) -> bytes:
        """Canonical bytes that the signature covers: every field except the signature."""
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


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sign(manifest: Manifest, cluster_key: bytes) -> Manifest:
    signature = hmac.new(cluster_key, manifest.body_bytes(), hashlib.sha256).hexdigest()
    return manifest.model_copy(update={"signature": signature})


def verify_signature(manifest: Manifest, cluster_key: bytes) -> None:
    """Raise ManifestError unless the manifest carries a valid signature under `cluster_key`."""
    if not manifest.signature:
        raise ManifestError(f"manifest of version {manifest.policy_version} is unsigned")
    expected = hmac.new(cluster_key, manifest.body_bytes(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, manifest.signature):
        raise ManifestError(f"manifest of version {manifest.policy_version} has a forged or corrupt signature")


def build_manifest(
    blob: bytes, *, run_id: str, policy_version: int, chunk_size_bytes: int, cluster_key: bytes
) -> tuple[Manifest, list[bytes]]:
    """Chunk `blob` and describe it; returns the signed manifest and the chunks in order."""
    chunks = split_into_chunks(blob, chunk_size_bytes)
    manifest = Manifest(
        run_id=run_id,
        policy_version=policy_version,
        total_size_bytes=len(blob),
        chunk_size_bytes=chunk_size_bytes,
        chunk_sha256=[sha256_hex(chunk) for chunk in chunks],
        blob_sha256=sha256_hex(blob),
        created_at_s=time.time(),
    )
    return sign(manifest, cluster_key), chunks


def verify_chunk(manifest: Manifest, index: int, data: bytes) -> None:
    """Raise ChunkVerificationError unless `data` is exactly chunk `index` of the manifest."""
    expected_length = manifest.chunk_length(index)
    if len(data) != expected_length:
        raise ChunkVerificationError(
            f"version {manifest.policy_version} chunk {index}: {len(data)} bytes, expected {expected_length}"
        )
    digest = sha256_hex(data)
    if digest != manifest.chunk_sha256[index]:
        raise ChunkVerificationError(
            f"version {manifest.policy_version} chunk {index}: sha256 {digest[:12]}.. != manifest {manifest.chunk_sha256[index][:12]}.."
        )


def assemble(manifest: Manifest, chunks: list[bytes]) -> bytes:
    """Join verified chunks and check the whole blob's hash; raises on any mismatch."""
    if len(chunks) != manifest.num_chunks:
        raise ChunkVerificationError(f"version {manifest.policy_version}: {len(chunks)} of {manifest.num_chunks} chunks")
    for index, chunk in enumerate(chunks):
        verify_chunk(manifest, index, chunk)
    blob = b"".join(chunks)
    if sha256_hex(blob) != manifest.blob_sha256:
        raise ChunkVerificationError(f"version {manifest.policy_version}: blob sha256 mismatch")
    return blob
