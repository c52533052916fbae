"""Measured T_bcast: from the swap reports workers send with their heartbeats to seconds per version.

    T_bcast(v) = (latest swap of v by a worker that was ACTIVE and registered when v was announced)
                 - (when the learner announced v)

recorded in `RunKeys.broadcast_times` (version -> seconds) once every such worker is accounted for:
it reported swapping v, or it reported a later version swapped after v was announced (a heartbeat
carries only the latest swap, so a worker that went v-1 -> v -> v+1 within one heartbeat interval
never shows v; it does not hold the measurement up, and its unseen swap time is not guessed). A
worker that joined after the announcement does not count (its first fetch is a late join, not part
of the broadcast). The capacity model reads the hash.

Recording: versions and announcement times come from the learner's announcements only
(services/coordinator/announcements.py: `broadcast_announced`, and the version as pending). The
heartbeat script (services/coordinator/heartbeat_batch.py) stores a swap the first time a worker reports
it (every heartbeat repeats the latest one), only of an announced version and only if it happened
between the announcement and now: the swap time per version (`broadcast_swaps`, kept SWAPS_TTL_S), the
worker's latest swap and, for downloads of at least MIN_MEASURED_BYTES, its rate. Completing
(`complete_pending`, a pass over the worker list) runs when such news arrives in a small fleet, and once
per control-loop pass always. Every stored number is read through services/coordinator/measurements.py
(a bad one is dropped and counted), and T_bcast is clamped to [0, MAX_BROADCAST_S].

Clocks: the announcement time is the learner's clock, `swapped_at_s` the worker's; on one machine (the
local cluster) they agree, across machines T_bcast carries their skew (MAX_CLOCK_SKEW_S is tolerated).
"""

from __future__ import annotations

import redis

from services.coordinator.measurements import MAX_BANDWIDTH_MBPS, bounded_float, bounded_hash, bounded_int
from shared.api import (
    MAX_DURATION_S,
    MAX_UNIX_TIME_S,
    MAX_VERSION,
    BroadcastTimesResponse,
    WorkerInfo,
    WorkerState,
)
from shared.keys import RunKeys

MIN_MEASURED_BYTES = 4 << 20  # below this a download is all latency: no throughput measurement
MAX_PENDING_VERSIONS = 32  # versions older than this many still incomplete are given up on
MAX_RECORDED_VERSIONS = 10_000  # T_bcast kept for this many newest versions (a 400-step demo keeps all)
SWAPS_TTL_S = 3600  # the per-version swap hashes are only needed until the version completes
MAX_BROADCAST_S = MAX_DURATION_S  # T_bcast is clamped to [0, this]


class BroadcastTimes:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.redis = client
        self.keys = keys

    def complete_pending(self, workers: list[WorkerInfo]) -> dict[int, float]:
        """Record T_bcast of every pending version every counted worker has accounted for; returns them."""
        pending = [
            v
            for raw in self.redis.zrange(self.keys.broadcast_pending, 0, -1)
            if (v := bounded_int(_text(raw), "broadcast.pending", 0, MAX_VERSION)) is not None
        ]
        if not pending:
            return {}
        announced = bounded_hash(
            self.redis.hgetall(self.keys.broadcast_announced), "broadcast.announced", 0.0, MAX_UNIX_TIME_S
        )
        last_swap = {
            _text(worker_id): swap
            for worker_id, value in self.redis.hgetall(self.keys.broadcast_last_swap).items()
            if (swap := _parse_last_swap(value)) is not None
        }
        active = [w for w in workers if w.state == WorkerState.ACTIVE]
        completed: dict[int, float] = {}
        for version in pending:
            announced_at_s = announced.get(str(version))
            if announced_at_s is None:
                continue
            swaps = bounded_hash(
                self.redis.hgetall(self.keys.broadcast_swaps(version)), "broadcast.swaps", 0.0, MAX_UNIX_TIME_S
            )
            seconds = broadcast_seconds(version, announced_at_s, swaps, last_swap, active)
            if seconds is not None:
                completed[version] = seconds
        with self.redis.pipeline(transaction=False) as pipe:
            for version, seconds in completed.items():
                pipe.hsetnx(self.keys.broadcast_times, str(version), repr(round(seconds, 4)))
                pipe.zrem(self.keys.broadcast_pending, str(version))
            pipe.zremrangebyrank(self.keys.broadcast_pending, 0, -MAX_PENDING_VERSIONS - 1)
            pipe.execute()
        if completed:
            self.trim()
        return completed

    def trim(self) -> None:
        """Keep T_bcast of the newest MAX_RECORDED_VERSIONS versions."""
        if self.redis.hlen(self.keys.broadcast_times) <= MAX_RECORDED_VERSIONS:
            return
        versions = sorted(self.times())
        self.redis.hdel(self.keys.broadcast_times, *(str(v) for v in versions[:-MAX_RECORDED_VERSIONS]))

    def times(self) -> dict[int, float]:
        """Every recorded T_bcast, by version (a bad stored one dropped and counted)."""
        raw = self.redis.hgetall(self.keys.broadcast_times)
        return {
            int(version): seconds
            for version, seconds in bounded_hash(raw, "broadcast.times", 0.0, MAX_BROADCAST_S, int_keys=True).items()
        }

    def summary(self) -> BroadcastTimesResponse:
        """Every recorded T_bcast with its mean, max and latest (None before the first)."""
        times = self.times()
        seconds = [times[version] for version in sorted(times)]
        return BroadcastTimesResponse(
            seconds_by_version=dict(sorted(times.items())),
            num_versions=len(times),
            mean_s=round(sum(seconds) / len(seconds), 4) if seconds else None,
            max_s=max(seconds) if seconds else None,
            last_s=seconds[-1] if seconds else None,
        )

    def measured_mbps(self) -> dict[str, float]:
        raw = self.redis.hgetall(self.keys.broadcast_throughput)
        return bounded_hash(raw, "broadcast.throughput", 0.0, MAX_BANDWIDTH_MBPS)


def broadcast_seconds(
    version: int,
    announced_at_s: float,
    swaps: dict[str, float],
    last_swap: dict[str, tuple[int, float]],
    active: list[WorkerInfo],
) -> float | None:
    """T_bcast of `version` if every counted worker is accounted for (see the module doc), else None."""
    counted = [w.worker_id for w in active if w.registered_at_s <= announced_at_s]
    swap_times = []
    for worker_id in counted:
        if worker_id in swaps:
            swap_times.append(swaps[worker_id])
            continue
        later_version, swapped_at_s = last_swap.get(worker_id, (-1, 0.0))
        if not (later_version > version and swapped_at_s >= announced_at_s):
            return None  # still fetching (or not reported yet)
    if not swap_times:
        return None  # nobody was seen holding it: no measurement
    return min(max(0.0, max(swap_times) - announced_at_s), MAX_BROADCAST_S)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _parse_last_swap(value: bytes | str) -> tuple[int, float] | None:
    """A worker's "<version>:<swapped_at_s>", None (counted) when it is not that."""
    version_text, _, swapped_text = _text(value).partition(":")
    version = bounded_int(version_text, "broadcast.last_swap", 0, MAX_VERSION)
    swapped_at_s = bounded_float(swapped_text, "broadcast.last_swap", 0.0, MAX_UNIX_TIME_S)
    return None if version is None or swapped_at_s is None else (version, swapped_at_s)
