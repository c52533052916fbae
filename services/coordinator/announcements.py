"""Which versions the learner has published, and when: read from the learner's own announcements (the
WEIGHTS stream, `WeightsPublished.published_at_s`), never from what a worker reports.

A worker's swap report (shared/api.py WeightSwapReport) says which version it loaded and when; it once
also supplied the announcement time and could name any version, so a worker could grow the per-version
hashes forever and set T_bcast to anything (issue 10, item 8). Now:

    WEIGHTS stream --ingest--> RunKeys.broadcast_announced  (version -> published_at_s; newest
                               MAX_ANNOUNCED_VERSIONS only)  + RunKeys.broadcast_pending (to measure)
    heartbeat script           records a swap only of an announced version, swapped between its
                               announcement and now (services/coordinator/heartbeat_batch.py); any
                               other report is ignored and counted (`IGNORED_SWAPS`)

Ingest runs once per control pass, and on demand (at most every MIN_INGEST_INTERVAL_S) when a heartbeat
reports a version not announced yet, after which that heartbeat's swap is tried once more; the worker
also repeats its latest swap with every heartbeat, so a swap reported just before the ingest that
announces it is recorded at the latest one heartbeat later, with its own time. A report of a version
never announced is ignored every time and costs one range read of the stream's new entries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import redis

from services.coordinator.measurements import BAD_MEASUREMENTS, bounded_float
from shared.api import MAX_UNIX_TIME_S
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.streams import WEIGHTS

log = logging.getLogger(__name__)

MAX_ANNOUNCED_VERSIONS = 64  # announcements kept (and read back from the stream per ingest)
MIN_INGEST_INTERVAL_S = 0.05  # on-demand ingests (one XREVRANGE of what is new): at most this often


class IgnoredSwaps:
    """Swap reports the heartbeat script ignored, by reason ('unannounced', 'time'); thread-safe."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


IGNORED_SWAPS = IgnoredSwaps()  # process-wide, like a Prometheus counter


class Announcements:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.redis = client
        self.keys = keys
        self.bus = StreamBus(client, keys, service="coordinator")
        self._lock = threading.Lock()
        self._last_ingest_s = 0.0
        self._last_id = "0-0"  # the newest announcement read: an ingest reads only what came after it

    def ingest(self) -> int:
        """Record the newest announcements of this run not recorded yet; returns how many were new."""
        messages, num_undecodable, self._last_id = self.bus.newest(
            WEIGHTS, MAX_ANNOUNCED_VERSIONS, after_id=self._last_id
        )
        for _ in range(num_undecodable):
            BAD_MEASUREMENTS.count("weights.announcement", "undecodable")
        published: dict[int, float] = {}
        for message in messages:
            at_s = bounded_float(message.published_at_s, "weights.published_at_s", 0.0, MAX_UNIX_TIME_S)
            if message.run_id == self.keys.run_id and at_s is not None:
                published.setdefault(message.policy_version, at_s)
        if not published:
            return 0
        with self.redis.pipeline(transaction=False) as pipe:
            for version, at_s in published.items():
                pipe.hsetnx(self.keys.broadcast_announced, str(version), repr(at_s))
            results = pipe.execute()
        new = {v: at_s for (v, at_s), added in zip(published.items(), results, strict=True) if added}
        if new:
            measured = self.redis.hmget(self.keys.broadcast_times, [str(v) for v in new])
            with self.redis.pipeline(transaction=False) as pipe:
                for (version, at_s), seconds in zip(new.items(), measured, strict=True):
                    if seconds is None:
                        pipe.zadd(self.keys.broadcast_pending, {str(version): at_s}, nx=True)
                pipe.execute()
            self.trim()
        return len(new)

    def ingest_due(self) -> bool:
        """Whether `ingest_soon` would read the stream now (a cheap check, no lock, no I/O)."""
        return time.monotonic() - self._last_ingest_s >= MIN_INGEST_INTERVAL_S

    def ingest_soon(self) -> int:
        """`ingest`, unless one ran less than MIN_INGEST_INTERVAL_S ago (a heartbeat named an unknown
        version); returns how many announcements were new."""
        with self._lock:
            now_s = time.monotonic()
            if now_s - self._last_ingest_s < MIN_INGEST_INTERVAL_S:
                return 0
            self._last_ingest_s = now_s
        return self.ingest()

    def trim(self) -> None:
        """Keep the newest MAX_ANNOUNCED_VERSIONS announcements (bounded whatever is reported)."""
        versions = sorted(int(v) for v in self.redis.hkeys(self.keys.broadcast_announced) if v.isdigit())
        old = versions[:-MAX_ANNOUNCED_VERSIONS]
        if old:
            self.redis.hdel(self.keys.broadcast_announced, *(str(v) for v in old))
