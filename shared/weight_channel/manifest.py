"""Weight chunking: a policy version's bytes, split into fixed-size chunks, described by a signed
manifest (version, sizes, the digest of every chunk and one digest of the whole payload).

A version travels as one of two payloads (an "artifact" is one version in one payload):
  full   the safetensors bytes of the state dict
  delta  `shared.weight_channel.delta` bytes that turn the full bytes of `base_version` into this version's
Both say `full_size_bytes` and `full_digest` of the weights they stand for, so the weights a worker
reconstructs from a delta are checked against the same digest as a full download; a delta also names
its base by digest (`base_digest`), so it is never applied to other bytes that share the version number
(a restarted learner re-uses numbers).

Digests (schema 4). Every chunk is hashed once, with the manifest's `hash_algorithm` (blake3 by
default: 3.3 GB/s per core here against sha256's 1.5 GB/s with SHA-NI; sha256 stays available). The
payload digest is not a second pass over the bytes: it is the hash of the ordered chunk digests,
bound to the sizes (`payload_digest`), a one-level hash list. Collision resistance carries over: two
payloads with the same digest would need a collision in the list hash or in one of the chunk hashes.
So a receiver that verified every chunk against a signed manifest holds exactly the payload the
learner signed, with no whole-blob hash after the transfer, and the learner hashes its bytes once.

A receiver verifies every chunk against the manifest before it stores, relays or loads it, and the
manifest's Ed25519 signature against the learner's public key before it trusts any of it. Only the
learner holds the private key (shared.signing): a worker can check the weights it relays but cannot
sign any of its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal, Self, cast

import blake3
from cryptography.exceptions import InvalidSignature
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from shared.signing import Ed25519PrivateKey, Ed25519PublicKey, key_id
from shared.weight_channel.lora import LoraAdapter


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
HashAlgorithm = Literal["blake3", "sha256"]
Buffer = bytes | bytearray | memoryview  # chunk and payload bytes: views of one buffer wherever possible
DEFAULT_HASH_ALGORITHM: HashAlgorithm = "blake3"
HASH_THREADS = 2  # hashlib and blake3 release the GIL on large inputs: chunks hash in parallel


def as_payload(text: str) -> Payload:
    """`text` ("full" or "delta") as a Payload; ValueError for anything else."""
    if text not in ("full", "delta"):
        raise ValueError(f"payload must be 'full' or 'delta', not {text!r}")
    return cast(Payload, text)


DIGEST_PATTERN = r"^[0-9a-f]{64}$"  # 32 bytes, blake3 or sha256
MANIFEST_SCHEMA_VERSION: Literal[4] = 4
# 4: chunk digests in `hash_algorithm` (blake3 by default), payload digest over the chunk digests
# 3: sha256 everywhere, the blob hashed again whole; 2: HMAC under a key every worker held
_OLD_SCHEMAS = {
    2: "version 2 manifests were HMAC-signed with the shared RL_CLUSTER_KEY, which any worker held, and are no "
    "longer trusted",
    3: "version 3 manifests hash the whole blob a second time (sha256 only); version 4 derives the payload digest "
    "from the chunk digests",
}


def sha256_hex(data: Buffer) -> str:
    return hashlib.sha256(data).hexdigest()


def chunk_digest(algorithm: HashAlgorithm, data: Buffer) -> str:
    """Hex digest of one chunk."""
    if algorithm == "blake3":
        return blake3.blake3(data).hexdigest()
    return hashlib.sha256(data).hexdigest()


def chunk_digests(
    algorithm: HashAlgorithm, chunks: Sequence[Buffer], pool: ThreadPoolExecutor | None = None
) -> list[str]:
    """Hex digests of `chunks`, in order, hashed in parallel on `pool` (or a pool of HASH_THREADS)."""
    if pool is not None:
        return list(pool.map(lambda chunk: chunk_digest(algorithm, chunk), chunks))
    with ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="hash") as own_pool:
        return chunk_digests(algorithm, chunks, own_pool)


def payload_digest(
    algorithm: HashAlgorithm, total_size_bytes: int, chunk_size_bytes: int, digests: Iterable[str]
) -> str:
    """The digest of a whole payload: the hash of its sizes and its ordered chunk digests (no pass over
    the bytes themselves; see the module docstring)."""
    listing = f"relay-rl payload v4 {algorithm} {total_size_bytes} {chunk_size_bytes}\n".encode()
    listing += b"".join(bytes.fromhex(digest) for digest in digests)
    return chunk_digest(algorithm, listing)


class Manifest(BaseModel):
    """Describes one published artifact (a policy version as a full or delta payload).
    Producer: learner. Consumers: chunk servers, workers. Every field is covered by the signature."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_version: Literal[4] = MANIFEST_SCHEMA_VERSION
    run_id: str = Field(min_length=1)
    policy_version: int = Field(ge=0)
    format: Literal["safetensors"] = "safetensors"
    payload: Payload = Field(
        "full", description="full: the safetensors bytes; delta: shared.weight_channel.delta bytes against base_version"
    )
    hash_algorithm: HashAlgorithm = Field(DEFAULT_HASH_ALGORITHM, description="of every digest in this manifest")
    total_size_bytes: int = Field(ge=0, description="bytes of this payload")
    chunk_size_bytes: int = Field(ge=1)
    chunk_digests: list[Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)]]
    digest: str = Field(pattern=DIGEST_PATTERN, description="payload_digest of this payload's chunk digests")
    full_size_bytes: int = Field(ge=0, description="bytes of the full weights this payload stands for")
    full_digest: str = Field(
        pattern=DIGEST_PATTERN, description="payload digest of the full weights (after applying a delta)"
    )
    base_version: int = Field(-1, ge=-1, description="delta: the version it applies to; -1 for a full payload")
    base_digest: str = Field("", pattern=r"^([0-9a-f]{64})?$", description="delta: full_digest of that base version")
    codec: str = Field("", max_length=64, description="delta: the shared.weight_channel.delta codec")
    model_fingerprint: str = Field(
        "",
        pattern=r"^([0-9a-f]{64})?$",
        description="shared.tokenization.model_fingerprint of the learner's folder (tokenizer + architecture); empty: unknown",
    )
    lora: LoraAdapter | None = Field(
        None,
        description="set: the payload is a LoRA adapter (shared/weight_channel/lora.py) for the base it names, not the full weights",
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
            why = _OLD_SCHEMAS.get(schema_version, "unknown schema") if isinstance(schema_version, int) else "unknown"
            raise ValueError(
                f"manifest schema_version {schema_version!r}, this receiver accepts only {MANIFEST_SCHEMA_VERSION} "
                f"(Ed25519-signed by the learner's RL_SIGNING_KEY): {why}; run the learner and the workers from "
                "the same release"
            )
        return data

    @model_validator(mode="after")
    def _chunk_count_matches_size(self) -> Self:
        expected = -(-self.total_size_bytes // self.chunk_size_bytes)
        if len(self.chunk_digests) != expected:
            raise ValueError(
                f"{len(self.chunk_digests)} chunk digests for {self.total_size_bytes} bytes in chunks of {self.chunk_size_bytes}"
            )
        return self

    @model_validator(mode="after")
    def _digest_lists_the_chunks(self) -> Self:
        expected = payload_digest(self.hash_algorithm, self.total_size_bytes, self.chunk_size_bytes, self.chunk_digests)
        if self.digest != expected:
            raise ValueError("digest is not the payload digest of chunk_digests")
        return self

    @model_validator(mode="after")
    def _payload_fields_agree(self) -> Self:
        if self.payload == "full":
            if (self.full_size_bytes, self.full_digest) != (self.total_size_bytes, self.digest):
                raise ValueError(
                    "a full payload must describe itself: full_size_bytes/full_digest != total_size_bytes/digest"
                )
            if self.base_version != -1 or self.base_digest or self.codec:
                raise ValueError("a full payload has no base_version, base_digest or codec")
        elif self.base_version < 0 or not self.base_digest or not self.codec:
            raise ValueError("a delta payload needs base_version, base_digest and codec")
        return self

    @property
    def artifact(self) -> str:
        """`<version>/<payload>`: what a chunk server's routes and logs call this manifest."""
        return f"{self.policy_version}/{self.payload}"

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_digests)

    def chunk_length(self, index: int) -> int:
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} of a {self.num_chunks}-chunk version")
        return min(self.chunk_size_bytes, self.total_size_bytes - index * self.chunk_size_bytes)

    def chunk_offset(self, index: int) -> int:
        """Where chunk `index` starts in the payload."""
        return index * self.chunk_size_bytes

    def body_bytes(self) -> bytes:
        """Canonical bytes that the signature covers: every field except the signature (the key id too)."""
        body = self.model_dump(mode="json", exclude={"signature", *self._absent_fields()})
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude=self._absent_fields()).encode()

    def _absent_fields(self) -> set[str]:
        """`lora` is left out of a full-weight manifest's bytes: they stay what they were before LoRA,
        so receivers of either age take each other's full-weight versions."""
        return {"lora"} if self.lora is None else set()

    def sha256(self) -> str:
        """sha256 of the manifest's JSON: how announcements and chunk requests pin it."""
        return hashlib.sha256(self.to_json()).hexdigest()

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise ManifestError(f"malformed manifest: {exc}") from exc


def chunk_views(payload: Buffer, chunk_size_bytes: int) -> list[memoryview]:
    """`payload` cut into chunks: read-only views of it, no copy."""
    if chunk_size_bytes < 1:
        raise ValueError(f"chunk_size_bytes must be positive, got {chunk_size_bytes}")
    view = memoryview(payload).cast("B").toreadonly()
    return [view[i : i + chunk_size_bytes] for i in range(0, len(view), chunk_size_bytes)]


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
    blob: Buffer,
    *,
    run_id: str,
    policy_version: int,
    chunk_size_bytes: int,
    signing_key: Ed25519PrivateKey,
    model_fingerprint: str = "",
    hash_algorithm: HashAlgorithm = DEFAULT_HASH_ALGORITHM,
    digests: list[str] | None = None,
    lora: LoraAdapter | None = None,
) -> tuple[Manifest, list[memoryview]]:
    """Describe the full weights `blob` (or, with `lora`, the whole adapter), signed; returns the manifest
    and the chunks (views of `blob`).
    `digests`: the chunk digests when the caller already hashed the chunks (the learner hashes them as
    it serialises); otherwise they are computed here, in parallel."""
    chunks = chunk_views(blob, chunk_size_bytes)
    size_bytes = sum(len(chunk) for chunk in chunks)
    digests = digests if digests is not None else chunk_digests(hash_algorithm, chunks)
    digest = payload_digest(hash_algorithm, size_bytes, chunk_size_bytes, digests)
    manifest = Manifest(
        run_id=run_id,
        policy_version=policy_version,
        hash_algorithm=hash_algorithm,
        total_size_bytes=size_bytes,
        chunk_size_bytes=chunk_size_bytes,
        chunk_digests=digests,
        digest=digest,
        full_size_bytes=size_bytes,
        full_digest=digest,
        model_fingerprint=model_fingerprint,
        lora=lora,
        created_at_s=time.time(),
    )
    return sign(manifest, signing_key), chunks


def build_delta_manifest(
    delta: Buffer, *, full: Manifest, base: Manifest, codec: str, signing_key: Ed25519PrivateKey
) -> tuple[Manifest, list[memoryview]]:
    """Chunk `delta` (which turns `base`'s full weights into `full`'s) and describe it, signed."""
    if full.lora is not None or base.lora is not None:
        raise ValueError("LoRA versions are published whole (an adapter is small): no deltas")
    if full.payload != "full" or base.payload != "full":
        raise ValueError(f"a delta is described by two full manifests, got {full.artifact} and {base.artifact}")
    if base.hash_algorithm != full.hash_algorithm:
        raise ValueError(
            f"base {base.artifact} is hashed with {base.hash_algorithm}, {full.artifact} with {full.hash_algorithm}"
        )
    chunks = chunk_views(delta, full.chunk_size_bytes)
    digests = chunk_digests(full.hash_algorithm, chunks)
    size_bytes = len(memoryview(delta).cast("B"))
    manifest = Manifest(
        run_id=full.run_id,
        policy_version=full.policy_version,
        payload="delta",
        hash_algorithm=full.hash_algorithm,
        total_size_bytes=size_bytes,
        chunk_size_bytes=full.chunk_size_bytes,
        chunk_digests=digests,
        digest=payload_digest(full.hash_algorithm, size_bytes, full.chunk_size_bytes, digests),
        full_size_bytes=full.full_size_bytes,
        full_digest=full.full_digest,
        base_version=base.policy_version,
        base_digest=base.full_digest,
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


def check_lora_base(manifest: Manifest, own_base_fingerprint: str) -> None:
    """Raise ModelMismatchError if `manifest` is a LoRA adapter for another base than the receiver's
    folder (shared.weight_channel.lora.base_fingerprint): applied to other base weights it would be another policy."""
    if manifest.lora is not None and manifest.lora.base_fingerprint != own_base_fingerprint:
        raise ModelMismatchError(
            f"version {manifest.artifact} is a LoRA adapter for base {manifest.lora.base_fingerprint[:12]}.., "
            f"this worker's base is {own_base_fingerprint[:12] or '(unknown)'}..: the learner and this worker hold "
            "different base weights (point both at the same model folder)"
        )


def verify_chunk(manifest: Manifest, index: int, data: Buffer) -> None:
    """Raise ChunkVerificationError unless `data` is exactly chunk `index` of the manifest."""
    expected_length = manifest.chunk_length(index)
    if len(data) != expected_length:
        raise ChunkVerificationError(
            f"version {manifest.artifact} chunk {index}: {len(data)} bytes, expected {expected_length}"
        )
    digest = chunk_digest(manifest.hash_algorithm, data)
    if digest != manifest.chunk_digests[index]:
        raise ChunkVerificationError(
            f"version {manifest.artifact} chunk {index}: {manifest.hash_algorithm} {digest[:12]}.. != manifest "
            f"{manifest.chunk_digests[index][:12]}.."
        )


def verify_full_weights(manifest: Manifest, blob: Buffer, pool: ThreadPoolExecutor | None = None) -> list[str]:
    """Raise ChunkVerificationError unless `blob` is the full weights `manifest` stands for (its
    `full_digest`, chunked like the manifest); returns the chunk digests (a full manifest's list). For
    weights a receiver built itself (a delta applied to its base): one hashing pass, in parallel."""
    view = memoryview(blob).cast("B")
    if len(view) != manifest.full_size_bytes:
        raise ChunkVerificationError(
            f"version {manifest.artifact}: the weights are {len(view)} bytes, the manifest says {manifest.full_size_bytes}"
        )
    digests = chunk_digests(manifest.hash_algorithm, chunk_views(view, manifest.chunk_size_bytes), pool)
    if payload_digest(manifest.hash_algorithm, len(view), manifest.chunk_size_bytes, digests) != manifest.full_digest:
        raise ChunkVerificationError(f"version {manifest.artifact}: the weights do not match full_digest")
    return digests
