"""Which versions the learner has published, and when: read from the learner's own announcements (the
WEIGHTS stream: `WeightsPublished.publish_started_at_s`, the start of T_bcast, and `published_at_s`),
never from what a worker reports.

A worker's swap report (shared/api.py WeightSwapReport) says which version it loaded and when; it once
also supplied the announcement time and could name any version, so a worker could grow the per-version
hashes forever and set T_bcast to anything (issue 10, item 8). Now:

    WEIGHTS stream --ingest--> RunKeys.broadcast_announced  (version -> publication start; newest
                               MAX_ANNOUNCED_VERSIONS only)  + RunKeys.broadcast_published (version ->
                               published_at_s, the same versions) + RunKeys.broadcast_pending (to measure)
    heartbeat script           records a swap only of an announced version, swapped between its
                               publication start and now (services/coordinator/heartbeat_batch.py); any
                               other report is ignored and counted (`WorkerRegistry.ignored_swaps`).
                               A version not in the hash yet is looked up in the stream's newest
                               entries by the script itself (and recorded), so a report right after
                               an announcement is never lost to the order of ingest and heartbeat.

Ingest runs once per control pass (reading only the entries after the last one it read); it records
the versions nobody has reported yet and keeps the hashes bounded.

The publication start is `publish_started_at_s` when the learner stamped it (0 < it <= published_at_s),
else `published_at_s` (a learner older than that field): T_bcast then counts from the announcement,
publication outside the window, as it did before.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

import redis

from services.coordinator.measurements import BAD_MEASUREMENTS, bounded_float
from shared.api import MAX_UNIX_TIME_S
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.streams import WEIGHTS

log = logging.getLogger(__name__)

MAX_ANNOUNCED_VERSIONS = 64  # announcements kept (and read back from the stream per ingest)


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


class Announcements:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.redis = client
        self.keys = keys
        self.bus = StreamBus(client, keys, service="coordinator")
        self._last_id = "0-0"  # the newest announcement read: an ingest reads only what came after it

    def ingest(self) -> int:
        """Record the newest announcements of this run not recorded yet; returns how many were new."""
        messages, num_undecodable, self._last_id = self.bus.newest(
            WEIGHTS, MAX_ANNOUNCED_VERSIONS, after_id=self._last_id
        )
        for _ in range(num_undecodable):
            BAD_MEASUREMENTS.count("weights.announcement", "undecodable")
        published: dict[int, tuple[float, float]] = {}  # version -> (publication start, announced at)
        for message in messages:
            at_s = bounded_float(message.published_at_s, "weights.published_at_s", 0.0, MAX_UNIX_TIME_S)
            if message.run_id == self.keys.run_id and at_s is not None:
                published.setdefault(message.policy_version, (publication_start_s(message, at_s), at_s))
        if not published:
            return 0
        with self.redis.pipeline(transaction=False) as pipe:
            for version, (start_s, at_s) in published.items():
                pipe.hsetnx(self.keys.broadcast_announced, str(version), repr(start_s))
                pipe.hsetnx(self.keys.broadcast_published, str(version), repr(at_s))
            results = pipe.execute()[::2]
        new = {v: start_s for (v, (start_s, _)), added in zip(published.items(), results, strict=True) if added}
        if new:
            measured = self.redis.hmget(self.keys.broadcast_times, [str(v) for v in new])
            with self.redis.pipeline(transaction=False) as pipe:
                for (version, at_s), seconds in zip(new.items(), measured, strict=True):
                    if seconds is None:
                        pipe.zadd(self.keys.broadcast_pending, {str(version): at_s}, nx=True)
                pipe.execute()
        self.trim()  # the heartbeat script records announcements too: trim whatever recorded them
        return len(new)

    def trim(self) -> None:
        """Keep the newest MAX_ANNOUNCED_VERSIONS announcements (bounded whatever is reported)."""
        versions = sorted(int(v) for v in self.redis.hkeys(self.keys.broadcast_announced) if v.isdigit())
        old = versions[:-MAX_ANNOUNCED_VERSIONS]
        if old:
            self.redis.hdel(self.keys.broadcast_announced, *(str(v) for v in old))
        published = [int(v) for v in self.redis.hkeys(self.keys.broadcast_published) if v.isdigit()]
        kept = set(versions[-MAX_ANNOUNCED_VERSIONS:])
        gone = [v for v in published if v not in kept]
        if gone:
            self.redis.hdel(self.keys.broadcast_published, *(str(v) for v in gone))


def publication_start_s(message: WeightsPublished, published_at_s: float) -> float:
    """When the learner started publishing `message`'s version: its publish_started_at_s when stamped and
    not after the announcement, else the announcement time (older learners, or a clock stepped back)."""
    start_s = message.publish_started_at_s
    return start_s if 0.0 < start_s <= published_at_s else published_at_s
