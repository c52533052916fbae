"""Following the learner's weight announcements: fetch, verify, keep for relaying, then swap.

`WeightsSync.update(engine)` is called by the worker between groups:
1. read the newest WeightsPublished on the weights stream (XREVRANGE count=1, no consumer group);
2. if it is not what the engine holds, fetch its manifest from the announcing chunk server and check
   it (cluster-key signature, run id, version, and that it is the manifest the announcement names);
3. fetch every chunk, verifying each sha256, into the worker's own ChunkStore (which its ChunkServer
   serves to other workers), and the reassembled blob against the manifest;
4. only then load it into the engine.
Any failed check leaves the engine on its old weights; that announcement is retried after
`retry_failed_after_s`.

"Not what the engine holds" compares manifests, not version numbers: a learner that crashed and
resumed from an older checkpoint announces lower (or re-used) version numbers, and workers must
follow it rather than wait for it to catch up with weights it no longer has.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import httpx
import redis

from services.rollout.engine import InferenceEngine, WeightsLoadError
from shared.bus import PAYLOAD_FIELD
from shared.chunk_client import fetch_chunk, fetch_manifest
from shared.chunk_server import ChunkStore
from shared.keys import RunKeys
from shared.messages import MessageDecodeError, WeightsPublished
from shared.weights import Manifest, WeightsError, assemble

log = logging.getLogger(__name__)


class AnnouncementError(WeightsError):
    """The announcement and the manifest it points to disagree, or the announcement is unusable."""


@dataclass(frozen=True)
class VerifiedVersion:
    """A policy version whose manifest signature and every byte were checked."""

    announcement: WeightsPublished
    manifest: Manifest
    blob: bytes

    @property
    def policy_version(self) -> int:
        return self.manifest.policy_version


class WeightsSync:
    def __init__(
        self,
        redis_client: redis.Redis,
        keys: RunKeys,
        store: ChunkStore,
        cluster_key: bytes,
        *,
        fetch_timeout_s: float = 30.0,
        retry_failed_after_s: float = 2.0,
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.store = store
        self.cluster_key = cluster_key
        self.retry_failed_after_s = retry_failed_after_s
        self.loaded: WeightsPublished | None = None
        self.num_rejected = 0
        self._http = httpx.Client(timeout=fetch_timeout_s)
        self._failed_at_s: dict[str, float] = {}  # manifest sha256 -> monotonic time of the last failure

    def update(self, engine: InferenceEngine) -> int | None:
        """Load the newest announced version into `engine` if it differs from the loaded one and every
        check passes. Returns the version loaded, or None (nothing new, waiting to retry, or rejected)."""
        announcement = self.latest_announcement()
        if announcement is None or not self._should_try(announcement):
            return None
        try:
            version = self.fetch_verified(announcement)
            engine.load_weights(version.blob, version.policy_version)
        except (WeightsError, WeightsLoadError) as exc:
            self._failed_at_s[announcement.manifest_sha256] = time.monotonic()
            self.num_rejected += 1
            log.warning(
                "rejected weights version %d (%s); keeping version %d, retrying in %.1fs",
                announcement.policy_version, exc, engine.policy_version, self.retry_failed_after_s,
            )
            return None
        self.loaded = announcement
        self._failed_at_s.pop(announcement.manifest_sha256, None)
        return version.policy_version

    def latest_announcement(self) -> WeightsPublished | None:
        entries = self.redis.xrevrange(self.keys.weights, count=1)
        if not entries:
            return None
        entry_id, fields = entries[0]
        try:
            return WeightsPublished.decode(fields.get(PAYLOAD_FIELD, b""))
        except MessageDecodeError as exc:
            log.warning("ignoring undecodable weights announcement %s: %s", entry_id, exc)
            return None

    def fetch_verified(self, announcement: WeightsPublished) -> VerifiedVersion:
        """The announced version, every check passed; raises a WeightsError subclass otherwise."""
        base_url = source_base_url(announcement)
        manifest = fetch_manifest(self._http, base_url, announcement.policy_version, self.cluster_key)
        check_manifest_matches(announcement, manifest, self.keys.run_id)
        started_s = time.perf_counter()
        blob = self._fetch_blob(base_url, manifest)
        log.info(
            "fetched version %d from %s: %d bytes in %d chunks, %.3fs",
            manifest.policy_version, base_url, manifest.total_size_bytes, manifest.num_chunks, time.perf_counter() - started_s,
        )
        return VerifiedVersion(announcement, manifest, blob)

    def close(self) -> None:
        self._http.close()

    def _should_try(self, announcement: WeightsPublished) -> bool:
        if self.loaded is not None and announcement.manifest_sha256 == self.loaded.manifest_sha256:
            return False
        failed_at_s = self._failed_at_s.get(announcement.manifest_sha256)
        return failed_at_s is None or time.monotonic() - failed_at_s >= self.retry_failed_after_s

    def _fetch_blob(self, base_url: str, manifest: Manifest) -> bytes:
        """Every chunk, verified; chunks already in the store (an earlier, interrupted attempt) are reused."""
        store = self._store_for(manifest)
        chunks: list[bytes] = []
        for index in range(manifest.num_chunks):
            chunk = store.get_chunk(manifest.policy_version, index) if store else None
            if chunk is None:
                chunk = fetch_chunk(self._http, base_url, manifest, index)  # verifies its sha256
                if store:
                    store.put_chunk(manifest.policy_version, index, chunk)
            chunks.append(chunk)
        return assemble(manifest, chunks)

    def _store_for(self, manifest: Manifest) -> ChunkStore | None:
        """The store to keep this version in for relaying, or None when it cannot hold it: it already
        has a different manifest under this version number (a resumed learner re-used the number), or
        the version is older than every version it keeps (evicted on arrival)."""
        self.store.add_manifest(manifest)
        if self.store.manifest(manifest.policy_version) != manifest:
            log.warning("cannot keep version %d in the chunk store; loading it without relaying", manifest.policy_version)
            return None
        return self.store


def source_base_url(announcement: WeightsPublished) -> str:
    """The chunk server that announced: `manifest_url` is `<base>/v1/weights/<v>/manifest`."""
    suffix = f"/v1/weights/{announcement.policy_version}/manifest"
    if not announcement.manifest_url.endswith(suffix):
        raise AnnouncementError(f"manifest_url {announcement.manifest_url!r} does not end with {suffix!r}")
    base_url = announcement.manifest_url.removesuffix(suffix)
    if not base_url.startswith(("http://", "https://")):
        raise AnnouncementError(f"manifest_url {announcement.manifest_url!r} is not an http(s) URL")
    return base_url


def check_manifest_matches(announcement: WeightsPublished, manifest: Manifest, run_id: str) -> None:
    """The (signature-checked) manifest must be the one the announcement names, for this run."""
    if manifest.run_id != run_id:
        raise AnnouncementError(f"manifest of version {manifest.policy_version} is for run {manifest.run_id!r}, not {run_id!r}")
    if manifest.sha256() != announcement.manifest_sha256:
        raise AnnouncementError(f"manifest of version {manifest.policy_version} is not the announced one (sha256 differs)")
    if (manifest.total_size_bytes, manifest.num_chunks) != (announcement.total_size_bytes, announcement.num_chunks):
        raise AnnouncementError(
            f"version {manifest.policy_version}: manifest says {manifest.total_size_bytes} bytes in {manifest.num_chunks} chunks, "
            f"announcement {announcement.total_size_bytes} in {announcement.num_chunks}"
        )

