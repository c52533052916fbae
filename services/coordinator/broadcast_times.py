"""Measured T_bcast: from the swap reports workers send with their heartbeats to seconds per version.

    T_bcast(v) = (latest swap of v by a worker that was ACTIVE and registered when v was announced)
                 - (when the learner announced v)

recorded in `RunKeys.broadcast_times` (version -> seconds) once every such worker is accounted for:
it reported swapping v, or it reported a later version swapped after v was announced (a heartbeat
carries only the latest swap, so a worker that went v-1 -> v -> v+1 within one heartbeat interval
never shows v; it does not hold the measurement up, and its unseen swap time is not guessed). A
worker that joined after the announcement does not count (its first fetch is a late join, not part
of the broadcast). The capacity model reads the hash.

Recording: the heartbeat script (services/coordinator/heartbeat_batch.py) stores a swap the first time a
worker reports it (every heartbeat repeats the latest one): the swap time per version (`broadcast_swaps`,
kept SWAPS_TTL_S), the announcement, the version as pending, the worker's latest swap and, for downloads
of at least MIN_MEASURED_BYTES, its rate. Completing (`complete_pending`, a pass over the worker list)
runs when such news arrives in a small fleet, and once per control-loop pass always.

Clocks: `announced_at_s` is the learner's clock, `swapped_at_s` the worker's; on one machine (the
local cluster) they agree, across machines T_bcast carries their skew.
"""

from __future__ import annotations

import redis

from shared.api import BroadcastTimesResponse, WorkerInfo, WorkerState
from shared.keys import RunKeys

MIN_MEASURED_BYTES = 4 << 20  # below this a download is all latency: no throughput measurement
MAX_PENDING_VERSIONS = 32  # versions older than this many still incomplete are given up on
SWAPS_TTL_S = 3600  # the per-version swap hashes are only needed until the version completes


class BroadcastTimes:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.redis = client
        self.keys = keys

    def complete_pending(self, workers: list[WorkerInfo]) -> dict[int, float]:
        """Record T_bcast of every pending version every counted worker has accounted for; returns them."""
        pending = [int(_text(v)) for v in self.redis.zrange(self.keys.broadcast_pending, 0, -1)]
        if not pending:
            return {}
        announced = _float_hash(self.redis.hgetall(self.keys.broadcast_announced))
        last_swap = {
            _text(worker_id): _parse_last_swap(value)
            for worker_id, value in self.redis.hgetall(self.keys.broadcast_last_swap).items()
        }
        active = [w for w in workers if w.state == WorkerState.ACTIVE]
        completed: dict[int, float] = {}
        for version in pending:
            announced_at_s = announced.get(str(version))
            if announced_at_s is None:
                continue
            swaps = _float_hash(self.redis.hgetall(self.keys.broadcast_swaps(version)))
            seconds = broadcast_seconds(version, announced_at_s, swaps, last_swap, active)
            if seconds is not None:
                completed[version] = seconds
        with self.redis.pipeline(transaction=False) as pipe:
            for version, seconds in completed.items():
                pipe.hsetnx(self.keys.broadcast_times, str(version), repr(round(seconds, 4)))
                pipe.zrem(self.keys.broadcast_pending, str(version))
            pipe.zremrangebyrank(self.keys.broadcast_pending, 0, -MAX_PENDING_VERSIONS - 1)
            pipe.execute()
        return completed

    def times(self) -> dict[int, float]:
        """Every recorded T_bcast, by version."""
        return {
            int(version): seconds
            for version, seconds in _float_hash(self.redis.hgetall(self.keys.broadcast_times)).items()
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
        return _float_hash(self.redis.hgetall(self.keys.broadcast_throughput))


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
    return max(swap_times) - announced_at_s


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _float_hash(raw: dict) -> dict[str, float]:
    return {_text(name): float(_text(value)) for name, value in raw.items()}


def _parse_last_swap(value: bytes | str) -> tuple[int, float]:
    version, _, swapped_at_s = _text(value).partition(":")
    return int(version), float(swapped_at_s)
