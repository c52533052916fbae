"""Measured T_bcast: from the swap reports workers send with their heartbeats to seconds per version.

    T_bcast(v) = (latest swap of v by a worker that was ACTIVE and registered when v was announced)
                 - (when the learner started publishing v: right after its optimizer step)

The window is end to end, "learner publish start -> engine sampling with the version": the learner's
publication (serialise, hash, sign, store, announce), the transfer through the relay, the worker's
verification, the wait for the group in flight and the load into the engine. A learner that does not
stamp `WeightsPublished.publish_started_at_s` (older ones) is measured from its announcement instead.
Recorded with it, per version (`RunKeys.broadcast_splits`, BroadcastSplits on the API):

    publish_s     publication start -> announcement (the learner's share)
    ready_s       publication start -> the verified weights ready in the last counted worker
    pause         the rollout pause: seconds each counted worker's engine spent loading the version
                  (not generating), mean and max, from the workers that report it (`pause_s`)

recorded in `RunKeys.broadcast_times` (version -> seconds) once all but the f slowest counted workers
are accounted for, f = max(1, n // 10) of n >= 3 counted workers (0 for n <= 2): T_bcast is the
(n - f)-th swap, the 90% quantile of the fleet, not its last worker, so up to f silent or slow workers
cannot stall the measurement nor stretch it (issue 23, attack 10: one worker that never swapped kept
every version pending). A worker is accounted for when it reported swapping v, or a later version
swapped after v's publication start (a heartbeat carries only the latest swap, so a worker that went
v-1 -> v -> v+1 within one heartbeat interval never shows v; it counts as one of the earliest, and
its unseen swap time is not guessed). A version that reaches neither is measured at its deadline
(DEADLINE_S after its publication start, or when it is about to fall out of the MAX_PENDING_VERSIONS
kept pending) from the swaps seen by then: the latest of them, a lower bound, so more than f silent
workers delay a measurement by at most the deadline and never stop it. A worker that joined after the
announcement does not count (its first fetch is a late join, not part of the broadcast). The capacity model reads the hash.

Recording: versions and announcement times come from the learner's announcements only
(services/coordinator/announcements.py: `broadcast_announced`, and the version as pending). The
heartbeat script (services/coordinator/heartbeat_batch.py) stores a swap the first time a worker reports
it (every heartbeat repeats the latest one), only of an announced version and only if it happened
between the publication start and now: the swap time per version (`broadcast_swaps`, kept SWAPS_TTL_S),
its readiness time and pause when reported (`broadcast_swap_splits`, the same TTL), the worker's latest
swap and, for downloads of at least MIN_MEASURED_BYTES, its rate (from the announcement). Completing
(`complete_pending`, a pass over the worker list) runs when such news arrives in a small fleet, and once
per control-loop pass always. Every stored number is read through services/coordinator/measurements.py
(a bad one is dropped and counted), and T_bcast is clamped to [0, MAX_BROADCAST_S]; a worker's pause to
[0, its swap - the publication start] (the load happened inside the window), readiness to [0, T_bcast].

Clocks: the publication start and announcement are the learner's clock, `swapped_at_s` and
`ready_at_s` the worker's (`pause_s` is a duration on one clock); on one machine (the
local cluster) they agree, across machines T_bcast carries their skew (MAX_CLOCK_SKEW_S is tolerated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from services.coordinator.measurements import (
    BAD_MEASUREMENTS,
    MAX_BANDWIDTH_MBPS,
    bounded_float,
    bounded_hash,
    bounded_int,
)
from shared.api import (
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_UNIX_TIME_S,
    MAX_VERSION,
    T_BCAST_WINDOW,
    BroadcastSplits,
    BroadcastTimesResponse,
    WorkerInfo,
    WorkerState,
)
from shared.bus import redis_text
from shared.keys import RunKeys

MIN_MEASURED_BYTES = 4 << 20  # below this a download is all latency: no throughput measurement
MAX_PENDING_VERSIONS = 32  # versions pending at once; the oldest beyond this are measured at their deadline
DEADLINE_S = 60.0  # a version not measured this long after its publication start is measured from what arrived
MAX_RECORDED_VERSIONS = 10_000  # T_bcast kept for this many newest versions (a 400-step demo keeps all)
SWAPS_TTL_S = 3600  # the per-version swap hashes are only needed until the version completes
MAX_BROADCAST_S = MAX_DURATION_S  # T_bcast is clamped to [0, this]


@dataclass(frozen=True)
class RelayKeys:
    """The relay plan's measurements (services/coordinator/relay_view.py); written by the heartbeat script
    (services/coordinator/heartbeat_batch.py) and, for `assigned`, by GET /parent."""

    assigned: str  # hash worker id -> the parent URL the coordinator last served it ('' for a seed: absent)
    observed: str  # hash worker id -> "<version> <parent_bytes> <num_bytes> <seconds> <parent_url>"
    misses: str  # hash parent URL -> "<last missed version> <misses>": its children fell back

    @classmethod
    def of(cls, keys: RunKeys) -> RelayKeys:
        return cls(
            keys.prefix + "broadcast:relay-assigned",
            keys.prefix + "broadcast:relay-observed",
            keys.prefix + "broadcast:relay-misses",
        )

    @property
    def all(self) -> tuple[str, str, str]:
        return self.assigned, self.observed, self.misses


@dataclass(frozen=True)
class SwapSplit:
    """What a worker reported beside its swap time (None: not reported)."""

    ready_at_s: float | None
    pause_s: float | None


@dataclass(frozen=True)
class VersionBroadcast:
    """One version's measured broadcast (see the module doc); seconds from the publication start."""

    seconds: float  # T_bcast
    publish_s: float | None = None
    ready_s: float | None = None
    pause_mean_s: float | None = None
    pause_max_s: float | None = None
    num_paused: int = 0


class BroadcastTimes:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.redis = client
        self.keys = keys

    def complete_pending(self, workers: list[WorkerInfo], now_s: float | None = None) -> dict[int, float]:
        """Record T_bcast of every pending version that all but the f slowest counted workers have
        accounted for, or that reached its deadline (see the module doc); returns them."""
        now_s = time.time() if now_s is None else now_s
        pending = sorted(
            v
            for raw in self.redis.zrange(self.keys.broadcast_pending, 0, -1)
            if (v := bounded_int(redis_text(raw, errors="replace"), "broadcast.pending", 0, MAX_VERSION)) is not None
        )
        if not pending:
            return {}
        announced = bounded_hash(
            self.redis.hgetall(self.keys.broadcast_announced), "broadcast.announced", 0.0, MAX_UNIX_TIME_S
        )
        published = bounded_hash(
            self.redis.hgetall(self.keys.broadcast_published), "broadcast.published", 0.0, MAX_UNIX_TIME_S
        )
        last_swap = {
            redis_text(worker_id, errors="replace"): swap
            for worker_id, value in self.redis.hgetall(self.keys.broadcast_last_swap).items()
            if (swap := _parse_last_swap(value)) is not None
        }
        active = [w for w in workers if w.state == WorkerState.ACTIVE]
        completed: dict[int, VersionBroadcast] = {}
        for position, version in enumerate(pending):
            started_at_s = announced.get(str(version))
            if started_at_s is None:
                continue
            # no announcement time (recorded by an older coordinator): the start is the announcement
            announced_at_s = max(started_at_s, published.get(str(version), started_at_s))
            swaps = bounded_hash(
                self.redis.hgetall(self.keys.broadcast_swaps(version)), "broadcast.swaps", 0.0, MAX_UNIX_TIME_S
            )
            # about to be dropped from the pending set, or past the deadline: measured from what arrived
            due = now_s - started_at_s >= DEADLINE_S or len(pending) - position >= MAX_PENDING_VERSIONS
            swapped = counted_swappers(version, started_at_s, announced_at_s, swaps, last_swap, active, due=due)
            if swapped is not None:
                splits = self.swap_splits(version)
                completed[version] = measure_version(started_at_s, announced_at_s, swaps, swapped, splits)
        with self.redis.pipeline(transaction=False) as pipe:
            for version, measured in completed.items():
                pipe.hsetnx(self.keys.broadcast_times, str(version), repr(round(measured.seconds, 4)))
                pipe.hsetnx(self.keys.broadcast_splits, str(version), _format_splits(measured))
                pipe.zrem(self.keys.broadcast_pending, str(version))
            pipe.zremrangebyrank(self.keys.broadcast_pending, 0, -MAX_PENDING_VERSIONS - 1)
            pipe.execute()
        if completed:
            self.trim()
        return {version: measured.seconds for version, measured in completed.items()}

    def swap_splits(self, version: int) -> dict[str, SwapSplit]:
        """What each worker reported beside its swap of `version` (a bad stored one dropped and counted)."""
        return {
            redis_text(worker_id, errors="replace"): split
            for worker_id, value in self.redis.hgetall(self.keys.broadcast_swap_splits(version)).items()
            if (split := _parse_swap_split(value)) is not None
        }

    def trim(self) -> None:
        """Keep T_bcast (and its splits) of the newest MAX_RECORDED_VERSIONS versions."""
        if self.redis.hlen(self.keys.broadcast_times) <= MAX_RECORDED_VERSIONS:
            return
        old = [str(v) for v in sorted(self.times())[:-MAX_RECORDED_VERSIONS]]
        self.redis.hdel(self.keys.broadcast_times, *old)
        self.redis.hdel(self.keys.broadcast_splits, *old)

    def times(self) -> dict[int, float]:
        """Every recorded T_bcast, by version (a bad stored one dropped and counted)."""
        raw = self.redis.hgetall(self.keys.broadcast_times)
        return {
            int(version): seconds
            for version, seconds in bounded_hash(raw, "broadcast.times", 0.0, MAX_BROADCAST_S, int_keys=True).items()
        }

    def splits(self, times: dict[int, float]) -> dict[int, BroadcastSplits]:
        """The recorded splits of T_bcast and the rollout pause of the versions in `times` (T_bcast by
        version), a bad stored one dropped and counted; versions measured before these were recorded
        have none."""
        out: dict[int, BroadcastSplits] = {}
        for raw_version, value in self.redis.hgetall(self.keys.broadcast_splits).items():
            version = bounded_int(redis_text(raw_version, errors="replace"), "broadcast.splits", 0, MAX_VERSION)
            if version is not None and version in times:
                split = _parse_splits(value, times[version])
                if split is not None:
                    out[version] = split
        return dict(sorted(out.items()))

    def summary(self) -> BroadcastTimesResponse:
        """Every recorded T_bcast with its mean, max and latest (None before the first), its splits and
        the rollout pause per version, and the pause over every counted swap."""
        times = self.times()
        seconds = [times[version] for version in sorted(times)]
        splits = self.splits(times)
        pause_mean_s, pause_max_s = pause_over(list(splits.values()))
        return BroadcastTimesResponse(
            seconds_by_version=dict(sorted(times.items())),
            num_versions=len(times),
            mean_s=round(sum(seconds) / len(seconds), 4) if seconds else None,
            max_s=max(seconds) if seconds else None,
            last_s=seconds[-1] if seconds else None,
            window=T_BCAST_WINDOW,
            splits_by_version=splits,
            pause_mean_s=pause_mean_s,
            pause_max_s=pause_max_s,
        )

    def recent_pause_s(self, num_versions: int) -> tuple[float | None, float | None]:
        """The rollout pause (mean, max) over the newest `num_versions` measured versions."""
        times = self.times()
        newest = dict(sorted(times.items())[-num_versions:])
        return pause_over(list(self.splits(newest).values()))

    def measured_mbps(self) -> dict[str, float]:
        raw = self.redis.hgetall(self.keys.broadcast_throughput)
        return bounded_hash(raw, "broadcast.throughput", 0.0, MAX_BANDWIDTH_MBPS)


def pause_over(splits: list[BroadcastSplits]) -> tuple[float | None, float | None]:
    """(mean over every counted swap that reported its pause, the longest), None before any."""
    paused = [s for s in splits if s.num_paused and s.pause_mean_s is not None]
    num_paused = sum(s.num_paused for s in paused)
    if not num_paused:
        return None, None
    mean_s = sum((s.pause_mean_s or 0.0) * s.num_paused for s in paused) / num_paused
    return round(mean_s, 4), max((s.pause_max_s for s in paused if s.pause_max_s is not None), default=None)


def num_tolerated(num_counted: int) -> int:
    """f: how many of `num_counted` workers T_bcast ignores (the slowest; silent ones among them):
    max(1, n // 10) from 3 workers on, none below (one of two is half the fleet, not an outlier)."""
    return max(1, num_counted // 10) if num_counted >= 3 else 0


def counted_swappers(
    version: int,
    started_at_s: float,
    announced_at_s: float,
    swaps: dict[str, float],
    last_swap: dict[str, tuple[int, float]],
    active: list[WorkerInfo],
    *,
    due: bool = False,
) -> list[str] | None:
    """The counted workers whose swap of `version` sets its T_bcast, else None (not measurable yet).
    Counted: active, and registered by the announcement (it reached them). Measurable once all but
    `num_tolerated(n)` of the n counted are accounted for (a swap of it, or of a later version since its
    publication start); then the earliest n - f accounted, skippers first (their swap of it is unseen,
    and was no later than their newer one). `due` (its deadline): every swap seen so far."""
    counted = [w.worker_id for w in active if w.registered_at_s <= announced_at_s]
    swapped = sorted((w for w in counted if w in swaps), key=lambda w: (swaps[w], w))
    num_skipped = 0
    for worker_id in counted:
        later_version, swapped_at_s = last_swap.get(worker_id, (-1, 0.0))
        if worker_id not in swaps and later_version > version and swapped_at_s >= started_at_s:
            num_skipped += 1
    num_needed = len(counted) - num_tolerated(len(counted))
    if not swapped:
        return None  # nobody seen holding it: no measurement
    if due:
        return swapped
    if len(swapped) + num_skipped < num_needed:
        return None  # still fetching (or not reported yet)
    return swapped[: max(1, num_needed - num_skipped)]


def measure_version(
    started_at_s: float,
    announced_at_s: float,
    swaps: dict[str, float],
    swapped: list[str],
    splits: dict[str, SwapSplit],
) -> VersionBroadcast:
    """T_bcast and its splits from the swaps of the counted workers `swapped` (and what they reported)."""
    seconds = _clamp(max(swaps[w] for w in swapped) - started_at_s, MAX_BROADCAST_S)
    reported = [(w, split) for w in swapped if (split := splits.get(w)) is not None]
    # a pause happened inside the window: at most the worker's own swap - the publication start
    pauses = [_clamp(split.pause_s, swaps[w] - started_at_s) for w, split in reported if split.pause_s is not None]
    ready = [split.ready_at_s - started_at_s for _, split in reported if split.ready_at_s is not None]
    return VersionBroadcast(
        seconds=seconds,
        publish_s=_clamp(announced_at_s - started_at_s, seconds),
        ready_s=_clamp(max(ready), seconds) if ready else None,
        pause_mean_s=round(sum(pauses) / len(pauses), 4) if pauses else None,
        pause_max_s=round(max(pauses), 4) if pauses else None,
        num_paused=len(pauses),
    )


def _clamp(seconds: float, high: float) -> float:
    return round(min(max(0.0, seconds), max(0.0, high)), 4)


def _parse_last_swap(value: bytes | str) -> tuple[int, float] | None:
    """A worker's "<version>:<swapped_at_s>", None (counted) when it is not that."""
    version_text, _, swapped_text = redis_text(value, errors="replace").partition(":")
    version = bounded_int(version_text, "broadcast.last_swap", 0, MAX_VERSION)
    swapped_at_s = bounded_float(swapped_text, "broadcast.last_swap", 0.0, MAX_UNIX_TIME_S)
    return None if version is None or swapped_at_s is None else (version, swapped_at_s)


def _parse_optional(parts: list[str], bounds: list[tuple[float, float]], source: str) -> list[float | None] | None:
    """Colon-separated stored numbers, '' for unknown; None (counted) when any part is not a number in
    its bounds or the count of parts is wrong."""
    if len(parts) != len(bounds):
        BAD_MEASUREMENTS.count(source, ":".join(parts))
        return None
    values: list[float | None] = []
    for part, (low, high) in zip(parts, bounds, strict=True):
        if part == "":
            values.append(None)
        elif (value := bounded_float(part, source, low, high)) is None:
            return None
        else:
            values.append(value)
    return values


def _parse_swap_split(value: bytes | str) -> SwapSplit | None:
    """A worker's "<ready_at_s>:<pause_s>" for one version."""
    bounds = [(0.0, MAX_UNIX_TIME_S), (0.0, MAX_DURATION_S)]
    values = _parse_optional(redis_text(value, errors="replace").split(":"), bounds, "broadcast.swap_splits")
    return None if values is None else SwapSplit(*values)


SPLIT_BOUNDS = [(0.0, MAX_BROADCAST_S)] * 4 + [(0.0, float(MAX_COUNT))]  # publish, ready, pause mean, max; count


def _format_splits(measured: VersionBroadcast) -> str:
    numbers = (measured.publish_s, measured.ready_s, measured.pause_mean_s, measured.pause_max_s)
    return ":".join("" if n is None else repr(n) for n in numbers) + f":{measured.num_paused}"


def _parse_splits(value: bytes | str, seconds: float) -> BroadcastSplits | None:
    """A version's "<publish_s>:<ready_s>:<pause_mean_s>:<pause_max_s>:<num_paused>" as recorded, with
    its T_bcast `seconds` (the transfer is the rest of it)."""
    values = _parse_optional(redis_text(value, errors="replace").split(":"), SPLIT_BOUNDS, "broadcast.splits")
    if values is None:
        return None
    publish_s, ready_s, pause_mean_s, pause_max_s, num_paused = values
    if num_paused is None or num_paused != int(num_paused):
        BAD_MEASUREMENTS.count("broadcast.splits", value)
        return None
    return BroadcastSplits(
        publish_s=publish_s,
        transfer_s=None if publish_s is None else round(max(0.0, seconds - publish_s), 4),
        ready_s=ready_s,
        pause_mean_s=pause_mean_s,
        pause_max_s=pause_max_s,
        num_paused=int(num_paused),
    )
