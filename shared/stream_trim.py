"""Trimming consumed stream entries, from the trusted service that consumed them (never from a worker):
the reward service trims `tasks` and `rollouts`, the learner `scored` (docs/operations.md, "Redis memory").

Each stream is cut below the oldest entry any of its consumer groups may still need (StreamBus.trim_consumed:
the oldest pending entry, or the last delivered one), so nothing unfinished ever goes. It runs every
`interval_s` rather than on every read: one XINFO + XPENDING + XTRIM per stream per interval, and the
approximate XTRIM frees whole internal nodes (100 entries each) at a time.

Nothing counts from a stream's length any more: the accounting reads counters written with each operation
(cluster/accounting.py), so trimming changes no figure of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from shared.bus import StreamBus
from shared.streams import DEAD, Stream

log = logging.getLogger(__name__)

TRIM_INTERVAL_S = 5.0  # at the demo's ~10 steps/s, a few thousand consumed entries per stream at most
DEAD_LETTERS_KEPT = 10_000  # the newest dead letters kept as evidence (each at most its entry's size)


class ConsumedTrimmer:
    """Trims `streams` (each read through a consumer group) to their consumed point, and keeps about the
    newest `dead_letters_kept` dead letters if that is set, at most once every `interval_s`."""

    def __init__(
        self,
        bus: StreamBus,
        streams: Sequence[Stream[Any]],
        *,
        interval_s: float = TRIM_INTERVAL_S,
        dead_letters_kept: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.bus = bus
        self.streams = tuple(streams)
        self.interval_s = interval_s
        self.dead_letters_kept = dead_letters_kept
        self.clock = clock
        self.num_trimmed = 0  # entries removed so far, all streams
        self._next_at_s = clock()

    def trim_if_due(self) -> int:
        """Trim now if `interval_s` has passed since the last time; returns the entries removed."""
        now_s = self.clock()
        if now_s < self._next_at_s:
            return 0
        self._next_at_s = now_s + self.interval_s
        return self.trim()

    def trim(self) -> int:
        num_removed = sum(self.bus.trim_consumed(stream) for stream in self.streams)
        if self.dead_letters_kept is not None:
            num_removed += self.bus.cap(DEAD, self.dead_letters_kept)
        self.num_trimmed += num_removed
        if num_removed:
            log.debug("trimmed %d consumed entries of %s", num_removed, ", ".join(s.name for s in self.streams))
        return num_removed
