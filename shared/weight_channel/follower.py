"""The worker's side of the weight channel: follow an announced version to verified weights, relaying
every chunk to this worker's own relay children as it arrives.

    manifest   from the announcing learner; Ed25519 signature under the learner's public key (the worker
               holds no key that can sign), run id, and that it is the announced one; the model (and a
               LoRA adapter's base) it was published for
    payload    the delta if we hold its base (same version AND same full digest), else the full one
    relay      relay_fetch.py: stream from our parent (the coordinator's plan), verify every chunk,
               store it (our chunk server relays it at once), route around dead, stalled or corrupt
               holders; the learner is the last resort
    rebuild    delta -> full weights; their digest (one hashing pass) must match the signed manifest's
    ready      a VerifiedVersion: the verified full weights, or in a LoRA run the verified adapter (a
               view of the store's buffer: no join, no second hash; with a store that has a spill_dir,
               also the complete safetensors file, linked for the engine)

Any failed check raises a WeightsError subclass and nothing is loadable. When to fetch, retry and swap
is the worker's business (services/rollout/weights_sync.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared.messages import WeightsPublished
from shared.signing import Ed25519PublicKey
from shared.weight_channel.client import fetch_manifest
from shared.weight_channel.delta import DeltaError, apply_delta, codec_of
from shared.weight_channel.manifest import (
    Buffer,
    ChunkVerificationError,
    Manifest,
    WeightsError,
    check_lora_base,
    check_model_fingerprint,
    verify_full_weights,
)
from shared.weight_channel.protocol import AnnouncementError, announced_source
from shared.weight_channel.relay_fetch import ArtifactFetch, RelayFetcher, SourceResolver
from shared.weight_channel.store import ChunkStore

log = logging.getLogger(__name__)

ParentLookup = Callable[[str], list[str]]  # learner URL -> holders to fetch from, best first


@dataclass(frozen=True)
class VerifiedVersion:
    """A policy version whose manifest signature and every byte were checked; `blob` is the full weights."""

    announcement: WeightsPublished
    manifest: Manifest  # the announced one (full or delta)
    blob: Buffer  # the full weights (safetensors bytes)
    num_bytes_downloaded: int = 0
    source_url: str = ""
    fetch_started_at_s: float = 0.0  # wall clock: the announcement was read, the manifest fetch begins
    transfer_done_at_s: float = 0.0  # wall clock: the last chunk of the announced artifact verified
    ready_at_s: float = 0.0  # wall clock: the full weights verified and ready to load
    path: Path | None = None  # the same bytes as a safetensors file (a link of our own), when the store spills
    # the relay parent the coordinator assigned, and the bytes it delivered of `num_bytes_downloaded` (the
    # coordinator ranks parents by what their children saw: relay_plan.py)
    parent_url: str = ""
    parent_bytes: int = 0

    @property
    def policy_version(self) -> int:
        return self.manifest.policy_version


@dataclass(frozen=True)
class _Base:
    """The newest full weights this worker verified: what a delta applies to."""

    policy_version: int
    full_digest: str
    blob: Buffer


class WeightFollower:
    """Fetches announced versions for one worker into its ChunkStore (served by its ChunkServer, so every
    chunk is relayed as it arrives) and hands back verified weights."""

    def __init__(
        self,
        store: ChunkStore,
        public_key: Ed25519PublicKey,
        *,
        run_id: str,
        parents: ParentLookup | None = None,
        own_url: str = "",
        fetch_timeout_s: float = 30.0,
        stall_timeout_s: float = 15.0,
        chunk_wait_s: float = 10.0,
        version_timeout_s: float = 120.0,
        model_fingerprint: str = "",
        base_fingerprint: str = "",
    ) -> None:
        self.store = store
        self.public_key = public_key  # the learner's: verifies manifests, cannot sign them
        self.run_id = run_id  # a manifest must name it
        self.parents = parents  # None: fetch from the learner only
        self.model_fingerprint = model_fingerprint  # of this worker's folder; "" checks nothing
        self.base_fingerprint = base_fingerprint  # lora.base_fingerprint of it; a LoRA version must name it
        self.relay = RelayFetcher(
            store,
            own_url=own_url,
            stall_timeout_s=stall_timeout_s,
            manifest_wait_s=chunk_wait_s,
            version_timeout_s=version_timeout_s,
        )
        self._http = httpx.Client(timeout=fetch_timeout_s)
        self._base: _Base | None = None

    def fetch_verified(self, announcement: WeightsPublished) -> VerifiedVersion:
        """The announced version's full weights, every check passed; raises a WeightsError subclass otherwise."""
        fetch_started_at_s = time.time()
        learner_url, announced_payload = announced_source(announcement)
        version = announcement.policy_version
        manifest = fetch_manifest(self._http, learner_url, version, self.public_key, payload=announced_payload)
        check_manifest_matches(announcement, manifest, self.run_id)
        check_model_fingerprint(manifest, self.model_fingerprint)
        check_lora_base(manifest, self.base_fingerprint)  # before a byte is fetched: a wrong base never loads
        resolve = self._sources(learner_url)
        base = self._base_of(manifest) if manifest.payload == "delta" else None
        full = manifest
        if base is not None:
            fetched = self.relay.fetch(manifest, resolve)
            blob: Buffer = rebuild_from_delta(manifest, base.blob, fetched.blob)
            full = self._keep_full_for_relaying(manifest, blob, learner_url) or manifest
        else:
            full = manifest
            if manifest.payload == "delta":  # a late joiner, or it missed the base: the full payload
                full = fetch_manifest(self._http, learner_url, version, self.public_key, payload="full")
                check_full_matches(manifest, full)
                log.info(
                    "no base v%d (%s..) for delta v%d: fetching the full payload",
                    manifest.base_version,
                    manifest.base_digest[:12],
                    version,
                )
            # peers hold a delta version's full payload only once they rebuilt it: do not wait for them
            fetched = self.relay.fetch(full, resolve, manifest_wait_s=0.0 if full is not manifest else None)
            blob = fetched.blob  # every chunk verified against the signed manifest: the payload is verified
        self._base = _Base(version, manifest.full_digest, blob)
        log_fetch(manifest, fetched)
        return VerifiedVersion(
            announcement,
            manifest,
            blob,
            fetched.num_bytes,
            fetched.main_source,
            fetch_started_at_s=fetch_started_at_s,
            transfer_done_at_s=fetched.done_at_s,
            ready_at_s=time.time(),
            path=self._link_for_engine(full),
            parent_url=fetched.parent_url,
            parent_bytes=fetched.parent_bytes,
        )

    def close(self) -> None:
        self.relay.close()
        self._http.close()
        close_parents = getattr(self.parents, "close", None)  # CoordinatorParents holds an HTTP client
        if close_parents is not None:
            close_parents()

    def _base_of(self, delta: Manifest) -> _Base | None:
        """The full weights `delta` applies to, if this worker holds them."""
        base = self._base
        if base is not None and (base.policy_version, base.full_digest) == (delta.base_version, delta.base_digest):
            return base
        return None

    def _sources(self, learner_url: str) -> SourceResolver:
        """Holders to stream from, best first; the learner always last (the coordinator's plan first)."""

        def resolve() -> list[str]:
            holders = self.parents(learner_url) if self.parents is not None else []
            return [*holders, learner_url]

        return resolve

    def _keep_full_for_relaying(self, delta: Manifest, blob: Buffer, learner_url: str) -> Manifest | None:
        """Store the rebuilt full payload under the learner's signed full manifest, so this worker can
        serve late joiners too (and, with a spilling store, have it as a file for the engine). Returns
        that manifest; None when it could not be had (best effort: late joiners fetch it elsewhere)."""
        try:
            full = fetch_manifest(self._http, learner_url, delta.policy_version, self.public_key, payload="full")
            check_full_matches(delta, full)
            self.store.put_version(full, blob, verified=True)  # rebuild_from_delta checked full_digest
            return full
        except WeightsError as exc:
            log.warning("not relaying the full payload of v%d: %s", delta.policy_version, exc)
            return None

    def _link_for_engine(self, full: Manifest) -> Path | None:
        """A link of our own to the complete safetensors file of `full` (stays valid when the store evicts
        the version before the engine loads it); None when the store keeps it in memory."""
        try:
            path = self.store.file_path(full) if full.payload == "full" else None
        except KeyError:
            return None
        if path is None:
            return None
        link = path.with_name(f"{path.stem}.ready{path.suffix}")
        link.unlink(missing_ok=True)
        os.link(path, link)
        return link


def rebuild_from_delta(delta: Manifest, base_blob: Buffer, payload: Buffer) -> bytes:
    """The full weights from a verified delta payload; raises unless they match `full_digest` (one
    hashing pass over the rebuilt bytes: they were made here, not received)."""
    try:
        if codec_of(payload) != delta.codec:
            raise DeltaError(f"the payload is a {codec_of(payload)} delta, the signed manifest says {delta.codec}")
        blob = apply_delta(base_blob, payload)
    except DeltaError as exc:
        raise ChunkVerificationError(f"version {delta.artifact}: {exc}") from exc
    verify_full_weights(delta, blob)
    return blob


def check_manifest_matches(announcement: WeightsPublished, manifest: Manifest, run_id: str) -> None:
    """The (signature-checked) manifest must be the one the announcement names, for this run."""
    if manifest.run_id != run_id:
        raise AnnouncementError(
            f"manifest of version {manifest.policy_version} is for run {manifest.run_id!r}, not {run_id!r}"
        )
    if manifest.sha256() != announcement.manifest_sha256:
        raise AnnouncementError(f"manifest of version {manifest.artifact} is not the announced one (sha256 differs)")
    if (manifest.total_size_bytes, manifest.num_chunks) != (announcement.total_size_bytes, announcement.num_chunks):
        raise AnnouncementError(
            f"version {manifest.artifact}: manifest says {manifest.total_size_bytes} bytes in {manifest.num_chunks} chunks, "
            f"announcement {announcement.total_size_bytes} in {announcement.num_chunks}"
        )


def check_full_matches(announced: Manifest, full: Manifest) -> None:
    """A (signature-checked) full manifest must describe the weights the announced manifest names."""
    if (full.run_id, full.policy_version, full.payload) != (announced.run_id, announced.policy_version, "full"):
        raise AnnouncementError(
            f"the full manifest {full.artifact} of run {full.run_id!r} does not go with {announced.artifact}"
        )
    if full.digest != announced.full_digest:
        raise AnnouncementError(
            f"the full payload of version {full.policy_version} is not the weights the announced delta names"
        )


def log_fetch(manifest: Manifest, fetched: ArtifactFetch) -> None:
    log.info(
        "fetched version %s: %d bytes in %d chunks, %.3fs, from %s%s%s",
        fetched.manifest.artifact,
        fetched.manifest.total_size_bytes,
        fetched.manifest.num_chunks,
        fetched.seconds,
        ", ".join(f"{url} ({num} B)" for url, num in fetched.bytes_by_source.items()) or "the local store",
        f"; {fetched.num_corrupt_chunks} corrupt chunks refetched" if fetched.num_corrupt_chunks else "",
        f"; {len(fetched.failures)} source failures" if fetched.failures else "",
    )
