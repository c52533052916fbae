"""The chunk store: every artifact a holder of weights has (the learner's publications, a worker's
received versions), one buffer each, chunk by chunk; server.py serves it over HTTP.

An artifact is one policy version in one payload (`full` or `delta`, see manifest.py). Every artifact is
one contiguous buffer, and a chunk is a read-only view of its region. A receiver streams each chunk
straight into its region (`receive_region`), verifies it there (`commit_chunk`) and only then serves it
as verified: no per-chunk copies, no join of the whole payload afterwards. While a chunk arrives, its
receiver reports the bytes written (`note_received`), so the server can forward them to children at
once (`wait_received`) and tell them afterwards whether they were the chunk verified here
(`wait_verdict`).

Liveness is progress, not a deadline: every wait here (`get_chunk`, `wait_received`, `wait_verdict`)
goes on as long as the artifact makes progress in this store (a piece written, a chunk verified) and
ends after its stall time without any (docs/weight_path.md, "Liveness").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shared.signing import Ed25519PublicKey
from shared.weight_channel.buffers import SPARE_SUFFIX, SpareBuffers, allocate_buffer, map_file
from shared.weight_channel.manifest import (
    Buffer,
    ChunkVerificationError,
    Manifest,
    Payload,
    chunk_digests,
    chunk_views,
    verify_chunk,
    verify_signature,
)

log = logging.getLogger(__name__)


class ManifestMismatchError(KeyError):
    """The holder has a different manifest under this version and payload than the one asked for."""


@dataclass
class _Receipt:
    """One chunk being received into its region: the `attempt`-th receipt of this artifact's chunks."""

    attempt: int
    num_bytes: int = 0  # written into the region so far
    failed: bool = False  # these bytes failed verification (or the sender said they were bad)


@dataclass(frozen=True)
class ReceivedBytes:
    """Bytes of one chunk for forwarding: `data` starts at the offset asked for. `held`: the chunk is
    verified (`data` runs to its end); otherwise they are the in-flight bytes of receipt `attempt`."""

    data: memoryview
    attempt: int
    held: bool


@dataclass
class _StoredArtifact:
    manifest: Manifest
    manifest_sha256: str
    buffer: memoryview | None = None  # the payload's bytes (allocated on the first chunk received)
    chunks: dict[int, memoryview] = field(default_factory=dict)  # verified chunks: read-only views of buffer
    file_path: Path | None = None  # the file backing `buffer` (spilled, or received into), if any
    receipts: dict[int, _Receipt] = field(default_factory=dict)  # chunks in flight (not held yet)
    held_from: dict[int, int] = field(default_factory=dict)  # chunk -> the receipt it was verified from (0: put whole)
    num_attempts: int = 0
    progress_at_s: float = field(default_factory=time.monotonic)  # last byte received or chunk held here
    source_url: str = ""  # the holder this store's own fetch streams it from now ("": none, or the learner's own)

    @property
    def complete(self) -> bool:
        return len(self.chunks) == self.manifest.num_chunks

    def region(self, index: int) -> memoryview:
        assert self.buffer is not None
        offset = self.manifest.chunk_offset(index)
        return self.buffer[offset : offset + self.manifest.chunk_length(index)]

    def release(self) -> None:
        """Drop the artifact's file, if any. A mapping stays valid for a request still sending one of its
        chunks and goes away with the last view (Linux keeps an unlinked file's pages until then)."""
        if self.file_path is not None:
            self.file_path.unlink(missing_ok=True)


class ChunkStore:
    """Thread-safe artifacts of the last `keep_versions` versions added (in arrival order, so a restarted
    learner's lower version numbers are kept). Every chunk is verified before it is held, except those of
    a version its producer put whole and vouches for (`put_version(..., verified=True)`: the learner).

    With `spill_dir`, full payloads live in files there instead of the process's memory: a whole version
    added at once (the learner's publications) is served from a read-only mapping of its file, and a
    full payload received chunk by chunk (a worker) is written into its file at each chunk's offset, so
    the finished file is the safetensors checkpoint an engine like vLLM loads by path (`file_path`).
    Files are page cache the kernel can drop and re-read (at Qwen3-0.6B in bf16, 4 versions are ~4.8 GB).

    With `trusted_key` (the learner's public key: a worker's store), a manifest is held only if the
    learner signed it (ManifestError otherwise), so nothing else is ever served or relayed from here and
    a forged manifest cannot replace a held one under the same number."""

    def __init__(
        self, keep_versions: int = 4, spill_dir: Path | None = None, trusted_key: Ed25519PublicKey | None = None
    ) -> None:
        self.keep_versions = keep_versions
        self.trusted_key = trusted_key
        self.spill_dir = spill_dir
        if spill_dir is not None:
            spill_dir.mkdir(parents=True, exist_ok=True)
            for pattern in ("*.chunks", "*.safetensors", f"*{SPARE_SUFFIX}"):
                for stale in spill_dir.glob(pattern):  # a previous process's: never served again
                    stale.unlink()
        self._versions: OrderedDict[int, dict[str, _StoredArtifact]] = OrderedDict()
        self._changed = threading.Condition()
        self._num_files = 0
        self.spares = SpareBuffers()  # the next full version's buffer, faulted in between versions

    # writing
    def add_manifest(self, manifest: Manifest) -> None:
        """Hold `manifest`'s artifact (no chunks yet). A different manifest under the same version and
        payload replaces the old one and its chunks: the learner restarted and re-used the number.
        Raises ManifestError (holding nothing) if the store has a trusted key that did not sign it."""
        if self.trusted_key is not None:
            verify_signature(manifest, self.trusted_key)
        with self._changed:
            artifacts = self._versions.get(manifest.policy_version)
            if artifacts is None:
                artifacts = self._versions[manifest.policy_version] = {}
                while len(self._versions) > self.keep_versions:
                    for evicted in self._versions.popitem(last=False)[1].values():
                        evicted.release()
            stored = artifacts.get(manifest.payload)
            if stored is None or stored.manifest != manifest:
                if stored is not None:
                    log.info("replacing version %s: a different manifest arrived under that number", manifest.artifact)
                    stored.release()
                artifacts[manifest.payload] = _StoredArtifact(manifest, manifest.sha256())
            self._changed.notify_all()

    def receive_region(self, manifest: Manifest, index: int) -> memoryview:
        """The writable region where chunk `index` of `manifest` goes: read it from the network straight
        into this, then `commit_chunk`. Raises KeyError unless `manifest` is held (add_manifest), and
        ValueError if that chunk is already held (its region is being served: never written again)."""
        with self._changed:
            stored = self._held(manifest)
            if index in stored.chunks:
                raise ValueError(f"chunk {index} of {manifest.artifact} is already held")
            if stored.buffer is None:
                stored.buffer, stored.file_path = self._allocate(manifest)
            stored.num_attempts += 1
            stored.receipts[index] = _Receipt(stored.num_attempts)
            self._progressed(stored)
            return stored.region(index)

    def note_received(self, manifest: Manifest, index: int, num_bytes: int) -> None:
        """The first `num_bytes` of chunk `index`'s region (since `receive_region`) are written: they can
        be forwarded (cut-through, unverified, with a verdict after) and they count as progress."""
        with self._changed:
            stored = self._held(manifest)
            receipt = stored.receipts.get(index)
            if receipt is not None:
                receipt.num_bytes = num_bytes
                self._progressed(stored)

    def reject_chunk(self, manifest: Manifest, index: int) -> None:
        """The bytes received for chunk `index` are bad (its sender said so): forwarders of them report
        it, and the chunk stays missing (receive it again)."""
        with self._changed:
            stored = self._held(manifest)
            receipt = stored.receipts.get(index)
            if receipt is not None:
                receipt.failed = True
                self._changed.notify_all()

    def commit_chunk(self, manifest: Manifest, index: int) -> None:
        """Verify chunk `index` in its region (filled since `receive_region`) and hold it: from now on it
        is served. Raises ChunkVerificationError (the chunk stays missing) or KeyError (the artifact left
        the store: evicted or replaced)."""
        with self._changed:
            stored = self._held(manifest)
            if stored.buffer is None:
                raise KeyError(f"nothing received for {manifest.artifact}")
            region = stored.region(index)
        try:
            verify_chunk(manifest, index, region)  # outside the lock: servers keep serving other chunks
        except ChunkVerificationError:
            self.reject_chunk(manifest, index)
            raise
        with self._changed:
            if self._held(manifest) is not stored:
                raise KeyError(f"version {manifest.artifact} left the store while chunk {index} arrived")
            stored.chunks[index] = region.toreadonly()
            receipt = stored.receipts.pop(index, None)
            stored.held_from[index] = receipt.attempt if receipt is not None else 0
            self._progressed(stored)
        if stored.complete:
            self._prepare_next(manifest)

    def put_chunk(self, policy_version: int, index: int, data: Buffer, payload: Payload = "full") -> None:
        """Hold a chunk fetched on its own: one copy into its region, verified there by commit_chunk.
        Raises ChunkVerificationError (nothing is held then) or KeyError (the artifact is not held)."""
        manifest = self.manifest(policy_version, payload)
        if manifest is None:
            raise KeyError(f"no manifest for version {policy_version}/{payload}")
        if len(data) != manifest.chunk_length(index):
            raise ChunkVerificationError(
                f"version {manifest.artifact} chunk {index}: {len(data)} bytes, expected {manifest.chunk_length(index)}"
            )
        try:
            region = self.receive_region(manifest, index)
        except ValueError:
            return  # held meanwhile: verified bytes already
        region[:] = data
        self.commit_chunk(manifest, index)

    def put_version(
        self,
        manifest: Manifest,
        payload: Buffer | Sequence[Buffer],
        *,
        verified: bool = False,
        file_path: Path | None = None,
    ) -> None:
        """Hold a whole artifact: `payload` is its bytes (or its chunks in order, joined here).
        `verified=True`: the caller produced these bytes and their digests itself (the learner), so they
        are not hashed again. `file_path`: the file `payload` is a mapping of (deleted with the version);
        without it, a store with `spill_dir` writes the payload to a file there and serves that."""
        if isinstance(payload, list | tuple):
            payload = b"".join(payload)
        view = memoryview(payload).cast("B").toreadonly()  # type: ignore[arg-type]
        if len(view) != manifest.total_size_bytes:
            raise ChunkVerificationError(
                f"version {manifest.artifact}: {len(view)} bytes, the manifest says {manifest.total_size_bytes}"
            )
        if not verified:
            digests = chunk_digests(manifest.hash_algorithm, chunk_views(view, manifest.chunk_size_bytes))
            for index, (digest, expected) in enumerate(zip(digests, manifest.chunk_digests, strict=True)):
                if digest != expected:
                    raise ChunkVerificationError(f"version {manifest.artifact} chunk {index}: digest mismatch")
        if file_path is None and self.spill_dir is not None and len(view):
            view, file_path = self._spill(manifest, view)
        self.add_manifest(manifest)
        with self._changed:
            stored = self._held(manifest)
            stored.release()  # the same manifest put again: the older file goes, its views stay valid
            stored.buffer, stored.file_path = view, file_path
            stored.chunks = {index: stored.region(index) for index in range(manifest.num_chunks)}
            stored.receipts, stored.held_from = {}, {}
            self._progressed(stored)
        self._prepare_next(manifest)

    def take_buffer(
        self, size_bytes: int, policy_version: int, payload: Payload = "full"
    ) -> tuple[memoryview, Path | None]:
        """A writable buffer for a payload this process is about to produce (the learner serialising a
        version): a file in spill_dir when there is one, else memory; pre-faulted when a spare of that
        size is ready. Returns the buffer and its file (pass both to put_version)."""
        path = self.new_file_path(policy_version, payload) if self.spill_dir is not None else None
        return self.spares.take(size_bytes, path), path

    def _prepare_next(self, manifest: Manifest) -> None:
        """A full version is complete: have a buffer ready for the next one (the same size, most likely)."""
        if manifest.payload == "full":
            self.spares.prepare(manifest.total_size_bytes, self.spill_dir)

    def new_file_path(self, policy_version: int, payload: Payload) -> Path:
        """A fresh file name in `spill_dir` for a payload (a mapped file is never rewritten under its
        views). Raises ValueError without a spill_dir."""
        if self.spill_dir is None:
            raise ValueError("this store keeps versions in memory (no spill_dir)")
        with self._changed:
            self._num_files += 1
            number = self._num_files
        suffix = "safetensors" if payload == "full" else "chunks"
        return self.spill_dir / f"{policy_version}-{payload}-{os.getpid()}-{number}.{suffix}"

    def _spill(self, manifest: Manifest, view: memoryview) -> tuple[memoryview, Path]:
        path = self.new_file_path(manifest.policy_version, manifest.payload)
        if manifest.payload == "full":
            buffer = self.spares.take(len(view), path)
            buffer[:] = view
            return buffer.toreadonly(), path
        with path.open("wb") as out:
            out.write(view)
        return map_file(path), path

    def _allocate(self, manifest: Manifest) -> tuple[memoryview, Path | None]:
        """A buffer for a payload received chunk by chunk: a file in spill_dir for a full payload when
        there is one (the checkpoint file an engine loads), else anonymous memory (pages are only
        committed as chunks arrive)."""
        if manifest.payload != "full":
            return allocate_buffer(manifest.total_size_bytes), None
        path = None
        if self.spill_dir is not None and manifest.total_size_bytes:
            path = self.new_file_path(manifest.policy_version, manifest.payload)
        return self.spares.take(manifest.total_size_bytes, path), path

    # reading
    def manifest(self, policy_version: int, payload: Payload = "full") -> Manifest | None:
        with self._changed:
            stored = self._artifact(policy_version, payload)
            return stored.manifest if stored else None

    def wait_for_manifest(
        self, policy_version: int, payload: Payload, manifest_sha256: str | None, wait_s: float
    ) -> Manifest | None:
        """The held manifest (the one with `manifest_sha256` when given), waiting up to `wait_s` for it to
        be added. Raises ManifestMismatchError if a different one is held when the wait ends. A delta is
        not waited for once this holder has the version's full payload without it: it went the full way
        (it lacked the base) and will never hold the delta, so its children move on at once. Nor is a version
        this holder does not hold while it holds a newer one: versions only ever arrive newest-last (the
        learner publishes in order, a follower fetches the newest announced), so it never will (a worker
        back from a partition asking for the version it was cut off in moves on at once)."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while True:
                stored = self._artifact(policy_version, payload)
                if stored is not None and manifest_sha256 in (None, stored.manifest_sha256):
                    return stored.manifest
                remaining_s = deadline - time.monotonic()
                if stored is None and payload == "delta" and self._artifact(policy_version, "full") is not None:
                    return None
                if stored is None and max(self._versions, default=policy_version) > policy_version:
                    return None
                if remaining_s <= 0:
                    if stored is not None:
                        raise ManifestMismatchError(f"version {policy_version}/{payload} is held with another manifest")
                    return None
                self._changed.wait(remaining_s)

    def get_chunk(
        self,
        policy_version: int,
        index: int,
        wait_s: float = 0.0,
        payload: Payload = "full",
        manifest_sha256: str | None = None,
    ) -> memoryview | None:
        """The verified chunk (a read-only view), waiting for it while this holder's copy of the artifact
        makes progress; None once `wait_s` passed with none (a stalled upstream), or at once for
        `wait_s` = 0. Raises KeyError for an artifact not held (ManifestMismatchError when held under
        another manifest than `manifest_sha256`)."""
        started_s = time.monotonic()
        with self._changed:
            while True:
                stored = self._artifact(policy_version, payload)
                if stored is None:
                    raise KeyError(f"version {policy_version}/{payload} is not held here")
                if manifest_sha256 is not None and manifest_sha256 != stored.manifest_sha256:
                    raise ManifestMismatchError(f"version {policy_version}/{payload} is held with another manifest")
                if not 0 <= index < stored.manifest.num_chunks:
                    raise KeyError(f"version {policy_version}/{payload} has no chunk {index}")
                chunk = stored.chunks.get(index)
                remaining_s = self._stall_left_s(stored, started_s, wait_s)
                if chunk is not None or remaining_s <= 0:
                    return chunk
                self._changed.wait(remaining_s)

    def set_source(self, manifest: Manifest, url: str) -> None:
        """The holder this store's own fetch of `manifest` streams from now ("" when it stops): a forwarder
        serving that holder itself must not wait on it (`wait_received`'s `requester_url`)."""
        with self._changed:
            stored = self._artifact(manifest.policy_version, manifest.payload)
            if stored is not None and stored.manifest == manifest:
                stored.source_url = url.rstrip("/")
                self._changed.notify_all()

    def source_of(self, manifest: Manifest) -> str:
        """The holder this store's own fetch of `manifest` streams from now ("": none)."""
        with self._changed:
            stored = self._artifact(manifest.policy_version, manifest.payload)
            return stored.source_url if stored is not None and stored.manifest == manifest else ""

    def wait_received(
        self, manifest: Manifest, index: int, offset: int, stall_s: float, requester_url: str = ""
    ) -> ReceivedBytes | None:
        """Bytes of chunk `index` from `offset` on, for a cut-through forwarder: the verified chunk once
        held, else whatever its current receipt wrote past `offset`, waiting while the artifact makes
        progress here. None after `stall_s` without progress; KeyError if the artifact left the store.
        None at once while the bytes are missing and this store's own fetch streams them from
        `requester_url`, the very holder asking: two workers fetching from each other (each had the other
        as parent in successive relay plans) would otherwise wait `stall_s` each."""
        started_s = time.monotonic()
        requester_url = requester_url.rstrip("/")
        with self._changed:
            while True:
                stored = self._held(manifest)
                held = stored.chunks.get(index)
                if held is not None:
                    return ReceivedBytes(held[offset:], stored.held_from.get(index, 0), held=True)
                receipt = stored.receipts.get(index)
                if receipt is not None and not receipt.failed and receipt.num_bytes > offset:
                    data = stored.region(index)[offset : receipt.num_bytes].toreadonly()
                    return ReceivedBytes(data, receipt.attempt, held=False)
                if requester_url and stored.source_url == requester_url:
                    return None
                remaining_s = self._stall_left_s(stored, started_s, stall_s)
                if remaining_s <= 0:
                    return None
                self._changed.wait(remaining_s)

    def wait_verdict(self, manifest: Manifest, index: int, attempts: set[int], stall_s: float) -> bool | None:
        """Whether the bytes a forwarder sent of chunk `index` (from receipts `attempts`) are the chunk
        this holder verified: True once it is held from exactly that one receipt, False as soon as that
        receipt failed or was replaced. None after `stall_s` without progress."""
        started_s = time.monotonic()
        with self._changed:
            while True:
                stored = self._held(manifest)
                if index in stored.chunks:
                    return attempts == {stored.held_from.get(index, 0)}
                receipt = stored.receipts.get(index)
                if len(attempts) != 1 or receipt is None or receipt.failed or receipt.attempt not in attempts:
                    return False
                remaining_s = self._stall_left_s(stored, started_s, stall_s)
                if remaining_s <= 0:
                    return None
                self._changed.wait(remaining_s)

    def received_bytes(self, manifest: Manifest, index: int) -> int:
        """Bytes of chunk `index` held (verified: all of them) or written by its current receipt; 0 when
        `manifest` is not held."""
        with self._changed:
            stored = self._artifact(manifest.policy_version, manifest.payload)
            if stored is None or stored.manifest != manifest:
                return 0
            if index in stored.chunks:
                return manifest.chunk_length(index)
            receipt = stored.receipts.get(index)
            return receipt.num_bytes if receipt is not None else 0

    def missing_chunks(self, manifest: Manifest) -> list[int]:
        """Indices of `manifest`'s chunks not held (all of them if another manifest is held instead)."""
        with self._changed:
            stored = self._artifact(manifest.policy_version, manifest.payload)
            if stored is None or stored.manifest != manifest:
                return list(range(manifest.num_chunks))
            return [index for index in range(manifest.num_chunks) if index not in stored.chunks]

    def payload(self, manifest: Manifest) -> memoryview:
        """The whole payload of `manifest` (a read-only view, no copy); raises KeyError unless every
        chunk is held under that manifest."""
        with self._changed:
            stored = self._complete(manifest)
            return stored.buffer.toreadonly() if stored.buffer is not None else memoryview(b"")

    def chunks(self, manifest: Manifest) -> list[memoryview]:
        """Every chunk of `manifest`, in order (views); raises KeyError unless all are held under it."""
        with self._changed:
            stored = self._complete(manifest)
            return [stored.chunks[index] for index in range(manifest.num_chunks)]

    def file_path(self, manifest: Manifest) -> Path | None:
        """The file holding `manifest`'s complete payload (spill_dir), or None when it is in memory."""
        with self._changed:
            return self._complete(manifest).file_path

    def is_complete(self, policy_version: int, payload: Payload = "full") -> bool:
        with self._changed:
            stored = self._artifact(policy_version, payload)
            return bool(stored and stored.complete)

    def latest_complete_version(self) -> int | None:
        """The most recently added version whose full payload is complete."""
        with self._changed:
            for version in reversed(self._versions):
                stored = self._versions[version].get("full")
                if stored is not None and stored.complete:
                    return version
            return None

    def versions(self) -> list[int]:
        with self._changed:
            return sorted(self._versions)

    def _artifact(self, policy_version: int, payload: str) -> _StoredArtifact | None:
        artifacts = self._versions.get(policy_version)
        return artifacts.get(payload) if artifacts else None

    def _progressed(self, stored: _StoredArtifact) -> None:
        """The artifact moved here (the caller holds the lock): waiters re-check, and their stall clock restarts."""
        stored.progress_at_s = time.monotonic()
        self._changed.notify_all()

    @staticmethod
    def _stall_left_s(stored: _StoredArtifact, started_s: float, stall_s: float) -> float:
        """Seconds a waiter that started at `started_s` may still wait: until `stall_s` after the later of
        its start and the artifact's last progress here."""
        return max(started_s, stored.progress_at_s) + stall_s - time.monotonic()

    def _held(self, manifest: Manifest) -> _StoredArtifact:
        """The artifact held under exactly `manifest` (the caller holds the lock); KeyError otherwise."""
        stored = self._artifact(manifest.policy_version, manifest.payload)
        if stored is None or stored.manifest != manifest:
            raise KeyError(f"version {manifest.artifact} is not held here under this manifest")
        return stored

    def _complete(self, manifest: Manifest) -> _StoredArtifact:
        stored = self._artifact(manifest.policy_version, manifest.payload)
        if stored is None or stored.manifest != manifest or not stored.complete:
            raise KeyError(f"version {manifest.artifact} is not complete here")
        return stored
