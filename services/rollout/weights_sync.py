"""Following the learner's weight announcements: fetch through the relay, verify, keep for relaying,
then swap between groups.

    background thread (`start()`), for every new announcement (services/rollout/announcement_client.py:
    a long poll of the coordinator's GET /v1/weights/latest; workers hold no Redis credentials):
        follow     the weight channel's WeightFollower (shared/weight_channel/follower.py): the signed
                   manifest checked, the payload (the delta when we hold its base) streamed from our
                   parent and relayed to our children as it arrives, every chunk verified, a delta
                   rebuilt and checked
        ready      the verified full weights, or in a LoRA run the verified adapter for the base the
                   manifest names (with a store that has a spill_dir, also the complete safetensors
                   file) wait for the worker loop
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
import threading
import time
from collections.abc import Callable

from engines.interface import InferenceEngine, WeightsLoadError
from services.rollout.announcement_client import AnnouncementSource, is_announcement_outage
from shared.api import MAX_DURATION_S, WeightSwapReport
from shared.messages import WeightsPublished
from shared.retry import Backoff
from shared.weight_channel import (
    ModelMismatchError,
    VerifiedVersion,
    WeightFollower,
    WeightsError,
)

log = logging.getLogger(__name__)

WAIT_NEWER_S = 5.0  # the background thread's long poll for the next announcement
JOIN_TIMEOUT_S = 5.0  # close() waits this long for a fetch in progress (never for a long poll)


class WeightsSync:
    def __init__(
        self,
        announcements: AnnouncementSource,
        follower: WeightFollower,
        *,
        retry_failed_after_s: float = 2.0,
        on_ready: Callable[[VerifiedVersion], None] | None = None,
    ) -> None:
        self.announcements = announcements  # closed by close()
        self.follower = follower  # fetches, relays and verifies; its store is the worker's chunk store
        self.on_ready = on_ready  # called on the fetching thread the moment a version is ready to load
        self.store = follower.store
        self.retry_failed_after_s = retry_failed_after_s
        self.loaded: WeightsPublished | None = None
        self.last_swap: WeightSwapReport | None = None  # read by the heartbeat thread
        self.num_rejected = 0
        self._failed_at_s: dict[str, float] = {}  # manifest sha256 -> monotonic time of the last failure
        self._fetched_sha256: str | None = None  # the announced manifest last fetched (ready or loaded)
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
        return self.follower.fetch_verified(announcement)

    def close(self) -> None:
        """Stop the thread: wait for a fetch in progress (at most JOIN_TIMEOUT_S), never for a long poll
        (the thread then ends when its poll answers, and closes the announcement source itself)."""
        self._stopping.set()
        thread = self._thread
        deadline_s = time.monotonic() + JOIN_TIMEOUT_S
        while thread is not None and thread.is_alive() and not self._polling.is_set() and time.monotonic() < deadline_s:
            thread.join(timeout=0.05)
        self.follower.close()
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
