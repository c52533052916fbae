"""A worker whose lease call got nothing because it already holds all it may (its allowance, or its credential's
room) gets its next lease calls answered empty for a while, at the coordinator's ASGI entry: no Redis, no FastAPI.

Earned leases bound what an identity and its credential hold (services/coordinator/work_scripts.py), but every
lease call still costs the coordinator a request and a Lua script that scans the pending leases: 160 identities of
20 credentials asking every 0.2 s for more than they may hold kept the coordinator's event loop saturated
(`make bench-sybil`, cell spread-20), and the honest workers' calls queued behind theirs. Nothing changes for such
a caller until it answers (or fails) a lease, or a lease of its credential is answered or expires, so:

    full (the identity's own room)         answered empty for HOLD_BASE_S, doubling per further full answer, up
                                           to half a lease time: its own leases cannot expire sooner than that
    full (its credential's room)           the same, up to CREDENTIAL_HOLD_MAX_S: a sibling's answer frees room
    an answer or a failure report          clears it (services/coordinator/routers/work.py)

An honest worker never notices: it asks for tasks when it has room for them and backs off on an empty answer
anyway (services/rollout/worker.py next_idle_wait_s). The early answer reads the worker id the bearer token
claims, unverified, so a made-up token naming a worker gets only the empty answer that worker earned. Per
coordinator process, at most MAX_TRACKED workers (the least recently held forgotten first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

HOLD_BASE_S = 0.25
CREDENTIAL_HOLD_MAX_S = 1.0
MAX_TRACKED = 100_000


class Full(StrEnum):
    """Why a lease call that granted nothing did (the LEASE script's fourth reply)."""

    NOT = ""  # it had room: there was simply nothing to lease
    OWN = "own"  # the identity holds its allowance
    CREDENTIAL = "credential"  # its credential holds what it may (allowance, budget or share)


@dataclass
class _Hold:
    count: int
    until_s: float


class LeasePacing:
    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic, max_tracked: int = MAX_TRACKED):
        self.own_hold_max_s = max(HOLD_BASE_S, lease_s / 2)
        self.clock = clock
        self.max_tracked = max_tracked
        self._holds: OrderedDict[str, _Hold] = OrderedDict()
        self._lock = threading.Lock()
        self.num_answered_early = 0  # lease calls answered empty without reaching Redis

    def note(self, worker_id: str, full: Full) -> float | None:
        """A lease call of `worker_id` granted nothing, for the reason `full`: seconds its next calls are answered
        empty (None: not full, nothing held)."""
        if full is Full.NOT:
            return None
        max_s = self.own_hold_max_s if full is Full.OWN else CREDENTIAL_HOLD_MAX_S
        with self._lock:
            previous = self._holds.pop(worker_id, None)
            count = 1 if previous is None else previous.count + 1
            hold_s = min(max_s, HOLD_BASE_S * 2 ** (count - 1))
            self._holds[worker_id] = _Hold(count, self.clock() + hold_s)
            while len(self._holds) > self.max_tracked:
                self._holds.popitem(last=False)
            return hold_s

    def clear(self, worker_id: str) -> None:
        """The worker answered or gave back a lease: its next lease call goes through."""
        with self._lock:
            self._holds.pop(worker_id, None)

    def answer_early(self, worker_id: str) -> bool:
        """True (counted) while the worker's lease calls are answered empty without reaching Redis."""
        with self._lock:
            hold = self._holds.get(worker_id)
            if hold is None or hold.until_s <= self.clock():
                return False
            self.num_answered_early += 1
            return True
