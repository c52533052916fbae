"""Following the learner's weight announcements: fetch through the relay, verify, keep for relaying,
then swap between groups.

    background thread (`start()`), for every new announcement (services/rollout/announcement_client.py:
    a long poll of the coordinator's GET /v1/weights/latest; workers hold no Redis credentials):
        manifest   from the announcing learner; Ed25519 signature under the learner's public key (this
                   worker holds no key that can sign), run id, and that it is the announced one
        payload    the delta if we hold its base (same version AND same full sha256), else the full one
        relay      services/rollout/relay_fetch.py: stream from our parent (the coordinator's plan),
                   verify every chunk, store it (our chunk server relays it at once), route around
                   dead, stalled or corrupt holders; the learner is the last resort
        rebuild    delta -> full weights; their digest (one hashing pass) must match the signed manifest's
        ready      the verified full weights, or in a LoRA run the verified adapter for the base the
                   manifest names (a view of the store's buffer: no join, no second hash; with a store
                   that has a spill_dir, also the complete safetensors file) wait for the worker loop
    worker loop, between groups: `update(engine)` loads the ready version (`load_adapter` for a LoRA
        one; never an unverified or incomplete one) and notes a WeightSwapReport for the next heartbeat
        (the coordinator's T_bcast).

Without `start()`, `update` fetches inline (tests, tools). Any failed check leaves the engine on its old
weights; that announcement is retried after `retry_failed_after_s`. An outage of the announcement source
(coordinator or Redis) is retried with backoff; the versions already fetched stay loadable meanwhile.

"Not what we hold" compares manifests, not version numbers: a learner that crashed and resumed from
an older checkpoint announces lower (or re-used) version numbers, and workers must follow it rather
than wait for it to catch up with weights it no longer has.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from engines.interface import InferenceEngine, WeightsLoadError
from services.rollout.announcement_client import AnnouncementSource, is_announcement_outage
from services.rollout.relay_fetch import ArtifactFetch, RelayFetcher, SourceResolver
from shared.api import MAX_DURATION_S, WeightSwapReport
from shared.chunk_client import AnnouncementError, announced_source, fetch_manifest
from shared.chunk_server import ChunkStore
from shared.delta import DeltaError, apply_delta, codec_of
from shared.messages import WeightsPublished
from shared.retry import Backoff
from shared.signing import Ed25519PublicKey
from shared.weights import (
    Buffer,
    ChunkVerificationError,
    Manifest,
    ModelMismatchError,
    WeightsError,
    check_lora_base,
    check_model_fingerprint,
    verify_full_weights,
)

log = logging.getLogger(__name__)

WAIT_NEWER_S = 5.0  # the background thread's long poll for the next announcement
JOIN_TIMEOUT_S = 5.0  # close() waits this long for a fetch in progress (never for a long poll)

__all__ = ["AnnouncementError", "VerifiedVersion", "WeightsSync", "check_manifest_matches"]

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
    # coordinator ranks parents by what their children saw: shared/relay_plan.py)
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


class WeightsSync:
    def __init__(
        self,
        announcements: AnnouncementSource,
        store: ChunkStore,
        public_key: Ed25519PublicKey,
        *,
        run_id: str,
        parents: ParentLookup | None = None,
        own_url: str = "",
        fetch_timeout_s: float = 30.0,
        retry_failed_after_s: float = 2.0,
        stall_timeout_s: float = 15.0,
        chunk_wait_s: float = 10.0,
        version_timeout_s: float = 120.0,
        model_fingerprint: str = "",
        base_fingerprint: str = "",
        on_ready: Callable[[VerifiedVersion], None] | None = None,
    ) -> None:
        self.announcements = announcements  # closed by close()
        self.run_id = run_id  # a manifest must name it
        self.on_ready = on_ready  # called on the fetching thread the moment a version is ready to load
        self.model_fingerprint = model_fingerprint  # of this worker's folder; "" checks nothing
        self.base_fingerprint = base_fingerprint  # shared.lora.base_fingerprint of it; a LoRA version must name it
        self.store = store
        self.public_key = public_key  # the learner's: verifies manifests, cannot sign them
        self.parents = parents  # None: fetch from the learner only
        self.retry_failed_after_s = retry_failed_after_s
        self.relay = RelayFetcher(
            store,
            own_url=own_url,
            stall_timeout_s=stall_timeout_s,
            manifest_wait_s=chunk_wait_s,
            version_timeout_s=version_timeout_s,
            repair_timeout_s=fetch_timeout_s,
        )
        self.loaded: WeightsPublished | None = None
        self.last_swap: WeightSwapReport | None = None  # read by the heartbeat thread
        self.num_rejected = 0
        self._http = httpx.Client(timeout=fetch_timeout_s)
        self._failed_at_s: dict[str, float] = {}  # manifest sha256 -> monotonic time of the last failure
        self._fetched_sha256: str | None = None  # the announced manifest last fetched (ready or loaded)
        self._base: _Base | None = None
        self._ready: VerifiedVersion | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._seen: WeightsPublished | None = None  # the newest announcement the thread has seen
        self._polling = threading.Event()  # set while the thread waits for the next announcement

    # the worker loop's side
    def start(self) -> None:
        """Fetch in a background thread from now on; `update` then only swaps what is ready."""
        self._thread = threading.Thread(target=self._follow_announcements, name="weights-sync", daemon=True)
        self._thread.start()

    def update(self, engine: InferenceEngine) -> int | None:
        """Load the newest verified version into `engine` if there is one it does not hold. Returns the
        version loaded, or None (nothing new, still fetching, waiting to retry, or rejected)."""
        if self._failure is not None:
            raise RuntimeError("the weights-sync thread failed") from self._failure
        if self._thread is None:
            announcement = self.latest_announcement()
            if announcement is not None and self._should_try(announcement):
                self._fetch(announcement)
        with self._lock:
            version, self._ready = self._ready, None
        if version is None:
            return None
        load_started_s = time.perf_counter()  # the rollout pause: the engine generates nothing until loaded
        try:
            if version.manifest.lora is not None:  # a LoRA run: the adapter, applied onto the engine's base
                engine.load_adapter(version.blob, version.manifest.lora, version.policy_version)
            else:
                engine.load_weights(version.blob, version.policy_version, path=version.path)
        except WeightsLoadError as exc:
            self._note_failure(version.announcement, exc)
            return None
        finally:
            if version.path is not None:
                version.path.unlink(missing_ok=True)
        pause_s = time.perf_counter() - load_started_s
        swapped_at_s = time.time()
        self.loaded = version.announcement
        self.last_swap = WeightSwapReport(
            policy_version=version.policy_version,
            announced_at_s=version.announcement.published_at_s,
            swapped_at_s=swapped_at_s,
            num_bytes=version.num_bytes_downloaded,
            source_url=version.source_url[:512],
            pause_s=min(pause_s, MAX_DURATION_S),
            # ready, then waiting for the group in flight, then loaded: never after the swap (a wall clock
            # stepped back in between would make the report invalid)
            ready_at_s=min(version.ready_at_s, swapped_at_s) if version.ready_at_s > 0 else None,
            parent_url=version.parent_url[:512],
            parent_bytes=version.parent_bytes,
        )
        return version.policy_version

    def latest_announcement(self) -> WeightsPublished | None:
        """The newest announcement, asked of the source now (None: none yet)."""
        return self.announcements.latest()

    def newest_announced_version(self) -> int | None:
        """The newest announced version (None: none yet). With `start()`, the newest the background thread
        has seen (no request: the worker loop may ask every turn); without, asked of the source now."""
        if self._thread is None:
            announcement = self.latest_announcement()
        else:
            announcement = self._seen
        return None if announcement is None else announcement.policy_version

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
        """Stop the thread: wait for a fetch in progress (at most JOIN_TIMEOUT_S), never for a long poll
        (the thread then ends when its poll answers, and closes the announcement source itself)."""
        self._stopping.set()
        thread = self._thread
        deadline_s = time.monotonic() + JOIN_TIMEOUT_S
        while thread is not None and thread.is_alive() and not self._polling.is_set() and time.monotonic() < deadline_s:
            thread.join(timeout=0.05)
        self.relay.close()
        self._http.close()
        close_parents = getattr(self.parents, "close", None)  # CoordinatorParents holds an HTTP client
        if close_parents is not None:
            close_parents()
        if thread is None or not thread.is_alive():
            self.announcements.close()

    # the background thread
    def _follow_announcements(self) -> None:
        try:
            backoff = Backoff()
            announcement = None  # the newest seen; None: none yet, or not asked yet
            while not self._stopping.is_set():
                try:
                    announcement = self._next_announcement(announcement)
                    if announcement is not None and not self._stopping.is_set() and self._should_try(announcement):
                        self._fetch(announcement)
                    backoff.reset()
                except Exception as exc:
                    if not is_announcement_outage(exc):
                        raise
                    if not self._stopping.is_set():
                        backoff.wait(self._stopping, exc, "reading weight announcements")
        except BaseException as exc:  # noqa: B036 (handed to the worker loop, see update)
            log.exception("weights-sync thread stopped")
            self._failure = exc
        finally:
            if self._stopping.is_set():  # close() left the source to us (see close)
                self.announcements.close()

    def _next_announcement(self, seen: WeightsPublished | None) -> WeightsPublished | None:
        """The announcement to act on next: whatever is news after `seen` (None: any announcement), at once
        if it came during a fetch, else waiting at most WAIT_NEWER_S or until `seen` may be retried;
        `seen` again if nothing came."""
        wait_s = WAIT_NEWER_S if seen is None else self._wait_before_retry_s(seen)
        if wait_s <= 0:
            return seen
        self._polling.set()
        try:
            if seen is None:
                newer = self.announcements.wait_newer(-1, wait_s)
            else:
                newer = self.announcements.wait_newer(seen.policy_version, wait_s, after_sha256=seen.manifest_sha256)
        finally:
            self._polling.clear()
        if newer is None:
            return seen
        self._seen = newer
        return newer

    # helpers
    def _fetch(self, announcement: WeightsPublished) -> None:
        """Fetch and verify; the result waits in `_ready` for the worker loop (a newer one replaces it)."""
        try:
            version = self.fetch_verified(announcement)
        except WeightsError as exc:
            self._note_failure(announcement, exc)
            return
        with self._lock:
            replaced, self._ready = self._ready, version
            self._fetched_sha256 = announcement.manifest_sha256
        if replaced is not None and replaced.path is not None:
            replaced.path.unlink(missing_ok=True)  # never loaded: a newer version was ready first
        self._failed_at_s.pop(announcement.manifest_sha256, None)
        if self.on_ready is not None:
            self.on_ready(version)

    def _note_failure(self, announcement: WeightsPublished, exc: Exception) -> None:
        # Weights for another model never become loadable: that manifest is not retried (one error
        # line per version; the worker stays up, generating nothing until matching weights come).
        permanent = isinstance(exc, ModelMismatchError)
        with self._lock:
            self._failed_at_s[announcement.manifest_sha256] = math.inf if permanent else time.monotonic()
            if self._fetched_sha256 == announcement.manifest_sha256:
                self._fetched_sha256 = None
        self.num_rejected += 1
        if permanent:
            log.error("refused weights version %d: %s", announcement.policy_version, exc)
            return
        log.warning(
            "rejected weights version %d (%s); keeping version %s, retrying in %.1fs",
            announcement.policy_version,
            exc,
            self.loaded.policy_version if self.loaded else "none",
            self.retry_failed_after_s,
        )

    def _wait_before_retry_s(self, announcement: WeightsPublished) -> float:
        """How long the thread may wait for news before `announcement` is due again: WAIT_NEWER_S unless
        it failed and its retry comes sooner (0: try it now)."""
        if self._should_try(announcement):
            return 0.0
        failed_at_s = self._failed_at_s.get(announcement.manifest_sha256)
        if failed_at_s is None or failed_at_s == math.inf:  # fetched, or never retried: only news matters
            return WAIT_NEWER_S
        return min(WAIT_NEWER_S, failed_at_s + self.retry_failed_after_s - time.monotonic())

    def _should_try(self, announcement: WeightsPublished) -> bool:
        if announcement.manifest_sha256 == self._fetched_sha256:
            return False
        failed_at_s = self._failed_at_s.get(announcement.manifest_sha256)
        return failed_at_s is None or time.monotonic() - failed_at_s >= self.retry_failed_after_s  # inf: never

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
