"""Stored measurements, read defensively: a value in Redis that is not a finite number within its bounds
is dropped and counted, never handed to the control computations.

Schemas bound what a client may send (shared/api.py), but Redis may still hold a bad value: written by
an older coordinator before those bounds existed, by hand, or by anything else holding Redis
credentials. One such value once made every control pass raise OverflowError, even after a restart
(issue 10, item 8). So every reader of a stored number (worker records, T_bcast per version, the
ledger, the history, the learner state) goes through this module:

    stored text -> finite float within [low, high] -> used
                -> anything else                    -> dropped (the field's neutral value, or the
                                                        entry left out), counted by source

The count is `rl_coordinator_bad_measurements_total{source}` on /metrics (services/coordinator/prometheus.py).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from shared.api import MAX_COUNT, MAX_DURATION_S, MAX_RATE_PER_S, MAX_TOTAL_S, MAX_UNIX_TIME_S, MAX_VERSION
from shared.bus import redis_text
from shared.messages import LearnerState

log = logging.getLogger(__name__)

MAX_PRICE_PER_HOUR = 10_000.0
MAX_BANDWIDTH_MBPS = 1e6
MAX_USD = 1e12


class BadMeasurements:
    """How many stored values were dropped, by source (thread-safe: the control pass runs in a thread)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, source: str, value: object) -> None:
        with self._lock:
            self._counts[source] += 1
            first = self._counts[source] == 1
        if first:  # once per source: a poisoned key is read every pass
            log.warning("dropped a bad stored measurement (%s): %.80r", source, value)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# Process-wide, like a Prometheus counter: every reader in this coordinator process counts here.
BAD_MEASUREMENTS = BadMeasurements()


def bounded_float(raw: object, source: str, low: float, high: float) -> float | None:
    """`raw` (stored text, bytes or a number) as a float in [low, high]; None (and counted) otherwise."""
    try:
        value = float(raw.decode() if isinstance(raw, bytes) else raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, UnicodeDecodeError):
        BAD_MEASUREMENTS.count(source, raw)
        return None
    if not (math.isfinite(value) and low <= value <= high):
        BAD_MEASUREMENTS.count(source, raw)
        return None
    return value


def bounded_int(raw: object, source: str, low: int, high: int) -> int | None:
    """`raw` as an integer in [low, high] (an integral float is accepted); None (and counted) otherwise."""
    value = bounded_float(raw, source, low, high)
    if value is None:
        return None
    if value != int(value):
        BAD_MEASUREMENTS.count(source, raw)
        return None
    return int(value)


def bounded_hash(
    raw: Mapping[Any, Any], source: str, low: float, high: float, *, int_keys: bool = False
) -> dict[str, float]:
    """A Redis hash of numbers (name -> value), bad entries left out. With `int_keys`, names must be
    versions (0..MAX_VERSION) too."""
    out: dict[str, float] = {}
    for name, value in raw.items():
        text = redis_text(name, errors="replace")
        if int_keys and bounded_int(text, source, 0, MAX_VERSION) is None:
            continue
        number = bounded_float(value, source, low, high)
        if number is not None:
            out[text] = number
    return out


# Worker record fields that are numbers: (low, high, neutral value used when the stored one is bad).
WORKER_NUMBER_FIELDS: dict[str, tuple[float, float, float]] = {
    "price_per_hour": (0.0, MAX_PRICE_PER_HOUR, 0.0),
    "bandwidth_mbps": (1e-9, MAX_BANDWIDTH_MBPS, 1000.0),
    "samples_per_s": (0.0, MAX_RATE_PER_S, 0.0),
    "tokens_per_s": (0.0, MAX_RATE_PER_S, 0.0),
    "group_latency_s": (0.0, MAX_DURATION_S, 0.0),
    "generating_s_total": (0.0, MAX_TOTAL_S, 0.0),
    "gated_s_total": (0.0, MAX_TOTAL_S, 0.0),
    "waiting_for_tasks_s_total": (0.0, MAX_TOTAL_S, 0.0),
    "state_since_s": (0.0, MAX_UNIX_TIME_S, 0.0),
    "registered_at_s": (0.0, MAX_UNIX_TIME_S, 0.0),
    "last_heartbeat_s": (0.0, MAX_UNIX_TIME_S, 0.0),
    "lease_expires_at_s": (0.0, MAX_UNIX_TIME_S, 0.0),
}
WORKER_INT_FIELDS: dict[str, tuple[int, int, int]] = {
    "policy_version": (-1, MAX_VERSION, -1),
    "num_groups_done": (0, MAX_COUNT, 0),
    "num_samples_done": (0, MAX_COUNT, 0),
}


def sanitize_worker_record(record: dict[str, Any]) -> dict[str, Any]:
    """A worker record as stored (strings) with every bad number replaced by its neutral value, counted."""
    clean = dict(record)
    for name, (low, high, neutral) in WORKER_NUMBER_FIELDS.items():
        if name in clean:
            value = bounded_float(clean[name], f"worker.{name}", low, high)
            clean[name] = neutral if value is None else value
    for name, (ilow, ihigh, ineutral) in WORKER_INT_FIELDS.items():
        if name in clean:
            number = bounded_int(clean[name], f"worker.{name}", ilow, ihigh)
            clean[name] = ineutral if number is None else number
    return clean


# LearnerState's float fields: (low, high). A bad one reads as 0 (the learner rewrites its state every step).
LEARNER_FLOAT_FIELDS: dict[str, tuple[float, float]] = {
    "last_reward_mean": (-1e9, 1e9),
    "last_train_s": (0.0, MAX_DURATION_S),
    "busy_fraction": (0.0, 1.0 + 1e-6),
    "updated_at_s": (0.0, MAX_UNIX_TIME_S),
    "train_s_total": (0.0, MAX_UNIX_TIME_S),
    "idle_s_total": (0.0, MAX_UNIX_TIME_S),
    "wall_s": (0.0, MAX_UNIX_TIME_S),
}


def sane_learner_state(state: LearnerState | None) -> LearnerState | None:
    """`state` with every bad float replaced by 0 and every engine-mismatch entry holding one left out
    (both counted), so no response or control computation sees a non-finite number."""
    if state is None:
        return None
    update: dict[str, Any] = {}
    for name, (low, high) in LEARNER_FLOAT_FIELDS.items():
        value = getattr(state, name)
        if not low <= value <= high:  # NaN fails too
            BAD_MEASUREMENTS.count(f"learner.{name}", value)
            update[name] = 0.0
    mismatch = {
        worker_id: m
        for worker_id, m in state.mismatch_by_worker.items()
        if math.isfinite(m.logprob_abs_diff_mean) and math.isfinite(m.kl_k3)
    }
    if len(mismatch) != len(state.mismatch_by_worker):
        BAD_MEASUREMENTS.count("learner.mismatch_by_worker", len(state.mismatch_by_worker) - len(mismatch))
        update["mismatch_by_worker"] = mismatch
    return state.model_copy(update=update) if update else state
