"""A worker that sends a submission body that is garbage (422: no WorkSubmission of this run, or over a decode
limit) has its next submissions refused for a while, before they are read.

Bounded decoding makes each bomb cheap to refuse (shared/bounded_msgpack.py), but not free: a body the size of the
run's limit is still received, and four senders posting 1 MiB bombs back to back kept the coordinator at 0.7 of a
core answering 136 bombs a second. An honest worker never sends such a body (its client encodes WorkSubmission),
so after one the sender's POST /v1/work/rollouts gets 429 with Retry-After from the coordinator's ASGI entry, the
body unread and the connection closed, for PENALTY_BASE_S, doubling with each further strike up to PENALTY_MAX_S;
a clean submission clears it. A strike follows only a request whose bearer token was verified; the early refusal
reads the worker id the token claims, so a made-up token naming a worker refuses nothing that worker did not earn.
Per coordinator process, at most MAX_TRACKED workers (the least recently struck forgotten first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

PENALTY_BASE_S = 0.5
PENALTY_MAX_S = 30.0
MAX_TRACKED = 100_000


@dataclass
class _Strikes:
    count: int
    until_s: float


class SubmissionPenalties:
    def __init__(self, clock: Callable[[], float] = time.monotonic, max_tracked: int = MAX_TRACKED) -> None:
        self.clock = clock
        self.max_tracked = max_tracked
        self._strikes: OrderedDict[str, _Strikes] = OrderedDict()
        self._lock = threading.Lock()
        self.num_refused = 0  # submissions refused early

    def strike(self, worker_id: str) -> float:
        """The worker sent a garbage body: it is refused for the returned seconds (doubling each strike)."""
        with self._lock:
            previous = self._strikes.pop(worker_id, None)
            count = 1 if previous is None else previous.count + 1
            penalty_s = min(PENALTY_MAX_S, PENALTY_BASE_S * 2 ** (count - 1))
            self._strikes[worker_id] = _Strikes(count, self.clock() + penalty_s)
            while len(self._strikes) > self.max_tracked:
                self._strikes.popitem(last=False)
            return penalty_s

    def clear(self, worker_id: str) -> None:
        """A clean submission: the worker starts afresh."""
        with self._lock:
            self._strikes.pop(worker_id, None)

    def wait_s(self, worker_id: str) -> float | None:
        """Seconds the worker's submissions are still refused (counted as a refusal); None: not penalised now."""
        with self._lock:
            strikes = self._strikes.get(worker_id)
            if strikes is None:
                return None
            wait_s = strikes.until_s - self.clock()
            if wait_s <= 0:
                return None
            self.num_refused += 1
            return wait_s
