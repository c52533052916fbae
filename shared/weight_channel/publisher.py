"""The learner's side of the weight channel: publish a version (serialise, chunk, sign, make servable,
and only then announce).

    blob      = the tensors laid out as safetensors (layout.py), written once into the buffer they are
                served from (a file in the store's spill folder, else memory), each chunk hashed on
                other threads as soon as its bytes are written: one pass over the weights
    full      = build_manifest(blob, digests): version, sizes, every chunk digest and the payload
                digest derived from them, Ed25519-signed (learner only); chunks are views of the blob
    delta     = encode_smallest(previous blob, blob): the smallest of delta.py's codecs (the sparse
                one of changed 16-bit words at real learning rates, docs/deltas.md), when allowed and
                smaller than the blob
    store     = ChunkStore.put_version(full [, delta], verified=True)   # servable now; not re-hashed
    announce  = XADD WeightsPublished to `weights`          # last: every chunk is servable by then

Why announce only after the last chunk is hashed: a receiver verifies every chunk against the signed
manifest before it keeps or relays it, and the signature covers every chunk digest, so there is
nothing trustworthy to announce earlier. What that costs is the one pass (0.1-0.2 s for 256 MiB on
this 2-core machine, see docs/weight_path.md), against a transfer of 11 s at 200 Mbit/s.

The announcement names the delta when there is one, else the full payload. The full payload is
always servable too: a worker that does not hold the delta's base (it joined late, or missed the
previous version) fetches it instead. Every `full_every`-th version is announced full, so a worker
that lost track catches up within K versions without asking. One line per version goes to
`journal_path` (broadcast.jsonl): bytes announced as a fraction of the full size.

Which tensors make a version is the learner's business (services/learner/publish.py
`publication_state`: the tied head left out; a LoRA model's adapter only, always whole: it is small,
see docs/lora.md, and its signed manifest names the adapter's rank, alpha, targets and base, `lora`).
torch is only needed by the caller's tensors: this module does not import it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.retry import call_with_retry
from shared.run_records import PublishRecord
from shared.signing import Ed25519PrivateKey
from shared.streams import WEIGHTS
from shared.weight_channel.delta import encode_smallest
from shared.weight_channel.layout import safetensors_size, write_safetensors
from shared.weight_channel.lora import LoraAdapter
from shared.weight_channel.manifest import (
    DEFAULT_HASH_ALGORITHM,
    HASH_THREADS,
    Buffer,
    HashAlgorithm,
    Manifest,
    build_delta_manifest,
    build_manifest,
    chunk_digest,
)
from shared.weight_channel.protocol import manifest_path
from shared.weight_channel.store import ChunkStore

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DELTA_ZSTD_LEVEL = 3  # zstd level of delta payloads (zstd's own default)


@dataclass(frozen=True)
class PublishedVersion:
    manifest: Manifest  # the announced one: the delta when there is one, else the full payload
    full_manifest: Manifest
    announcement: WeightsPublished
    publish_s: float  # serialise + hash + sign (+ delta) + store + announce
    serialize_s: float = 0.0  # the one pass: tensors copied into the buffer, chunks hashed alongside

    @property
    def size_fraction(self) -> float:
        """Bytes announced as a fraction of the full weights (1.0 for a full payload)."""
        return self.manifest.total_size_bytes / max(1, self.full_manifest.total_size_bytes)


class WeightPublisher:
    """Owns the learner's ChunkStore (served by its ChunkServer) and the `weights` announcements."""

    def __init__(
        self,
        bus: StreamBus,
        keys: RunKeys,
        store: ChunkStore,
        *,
        public_url: str,
        signing_key: Ed25519PrivateKey,  # the learner's private key: only this process can sign weights
        chunk_size_bytes: int,
        full_every: int = 1,
        journal_path: Path | None = None,
        model_fingerprint: str = "",  # shared.tokenization.model_fingerprint of the policy folder; signed into manifests
        hash_algorithm: HashAlgorithm = DEFAULT_HASH_ALGORITHM,
        lora: LoraAdapter | None = None,  # set: versions are this adapter (signed into manifests), never deltas
        dtype: torch.dtype | None = None,  # floating tensors published in this dtype (None: the model's own)
    ) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be at least 1, got {full_every}")
        self.bus = bus
        self.keys = keys
        self.store = store
        self.public_url = public_url.rstrip("/")
        self.signing_key = signing_key
        self.chunk_size_bytes = chunk_size_bytes
        self.lora = lora
        self.dtype = dtype
        self.full_every = 1 if lora is not None else full_every  # 1: every version full (no deltas)
        self.journal_path = journal_path
        self.model_fingerprint = model_fingerprint
        self.hash_algorithm: HashAlgorithm = hash_algorithm
        self.published_version = -1
        self._previous: tuple[Manifest, Buffer] | None = None  # full manifest and blob of the last version
        self._hash_pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="publish-hash")
        self._num_since_full = 0  # versions announced as deltas since the last full one

    def publish(self, tensors: Mapping[str, torch.Tensor], policy_version: int) -> PublishedVersion:
        """Publish `tensors` (name -> tensor, the version's state in its wire names) as `policy_version`;
        returns what was announced. Floating tensors go out in the publisher's `dtype`."""
        # Publishing a version number twice replaces it in the store (a restarted learner re-uses
        # numbers too): holders verify against the manifest they were announced, never the number.
        publish_started_at_s = time.time()  # wall clock: T_bcast starts here, right after the optimizer step
        started_s = time.perf_counter()
        blob, digests, file_path = self.serialize(tensors, policy_version)
        serialize_s = time.perf_counter() - started_s
        full, _ = build_manifest(
            blob,
            run_id=self.keys.run_id,
            policy_version=policy_version,
            chunk_size_bytes=self.chunk_size_bytes,
            signing_key=self.signing_key,
            model_fingerprint=self.model_fingerprint,
            hash_algorithm=self.hash_algorithm,
            digests=digests,
            lora=self.lora,
        )
        self.store.put_version(full, blob, verified=True, file_path=file_path)  # every chunk servable now
        announced = self.make_delta(full, blob) or full
        announcement = WeightsPublished(
            run_id=self.keys.run_id,
            policy_version=policy_version,
            manifest_url=self.public_url
            + manifest_path(policy_version, "delta" if announced.payload == "delta" else None),
            manifest_sha256=announced.sha256(),
            total_size_bytes=announced.total_size_bytes,
            num_chunks=announced.num_chunks,
            publish_started_at_s=publish_started_at_s,
        )
        call_with_retry(lambda: self.bus.publish(WEIGHTS, announcement), "announce weights")
        self.published_version = policy_version
        self._previous = (full, blob)
        self._num_since_full = self._num_since_full + 1 if announced.payload == "delta" else 0
        published = PublishedVersion(announced, full, announcement, time.perf_counter() - started_s, serialize_s)
        self.write_journal(published)
        log.info(
            "published v%d as %s%s: %d bytes (%.3f of %d full) in %d chunks (%.3fs)",
            policy_version,
            announced.payload,
            " LoRA adapter" if self.lora is not None else "",
            announced.total_size_bytes,
            published.size_fraction,
            full.total_size_bytes,
            announced.num_chunks,
            published.publish_s,
        )
        return published

    def serialize(
        self, tensors: Mapping[str, torch.Tensor], policy_version: int
    ) -> tuple[memoryview, list[str], Path | None]:
        """The version's safetensors bytes in their own buffer (a new file in the store's spill folder,
        else memory), with every chunk's digest computed alongside the copy: (blob, digests, file)."""
        if self.dtype is not None:  # inside the window: the cast is part of T_bcast
            dtype = self.dtype
            tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
        buffer, file_path = self.store.take_buffer(safetensors_size(tensors), policy_version)  # faulted in already
        pending: list[Future[str]] = []

        def hash_chunk(index: int, chunk: memoryview) -> None:
            pending.append(self._hash_pool.submit(chunk_digest, self.hash_algorithm, chunk))

        write_safetensors(tensors, buffer, chunk_size_bytes=self.chunk_size_bytes, on_chunk=hash_chunk)
        return buffer.toreadonly(), [future.result() for future in pending], file_path

    def close(self) -> None:
        self._hash_pool.shutdown()

    def make_delta(self, full: Manifest, blob: Buffer) -> Manifest | None:
        """The delta manifest of this version against the previous one, stored and servable, or None
        when this version goes out full (a snapshot is due, nothing to diff against, or not smaller)."""
        if self._previous is None or self._num_since_full + 1 >= self.full_every:
            return None
        base, base_blob = self._previous
        codec, delta = encode_smallest(base_blob, blob, level=DELTA_ZSTD_LEVEL)  # the smallest codec wins
        if len(delta) >= full.total_size_bytes:
            return None
        manifest, _ = build_delta_manifest(delta, full=full, base=base, codec=codec, signing_key=self.signing_key)
        self.store.put_version(manifest, delta, verified=True)
        return manifest

    def write_journal(self, published: PublishedVersion) -> None:
        if self.journal_path is None:
            return
        record = PublishRecord(
            policy_version=published.manifest.policy_version,
            payload=published.manifest.payload,
            base_version=published.manifest.base_version,
            payload_size_bytes=published.manifest.total_size_bytes,
            full_size_bytes=published.full_manifest.total_size_bytes,
            size_fraction=round(published.size_fraction, 5),
            publish_s=round(published.publish_s, 4),
            published_at_s=published.announcement.published_at_s,
        )
        with open(self.journal_path, "a") as journal:
            journal.write(record.model_dump_json() + "\n")
