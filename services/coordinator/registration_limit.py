"""The registration rate limit: a token bucket per coordinator process.

Registering costs Redis writes, a control pass and (with other parts of the issue) an ACL user; a
flood of registrations, even with a valid join token, must not grow Redis or starve heartbeats. The
bucket holds `burst` registrations and refills at `per_s`; an empty bucket answers 429 with
Retry-After (seconds until the next registration is admitted), which the worker's membership loop
honours (services/rollout/membership.py). Per process, not shared through Redis: two coordinators on
one Redis admit twice the rate, which is still bounded.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class RegistrationLimit:
    def __init__(self, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if per_s <= 0 or burst < 1:
            raise ValueError(f"per_s must be > 0 and burst >= 1, got {per_s}, {burst}")
        self.per_s = per_s
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._at_s = clock()
        self._lock = threading.Lock()  # sync endpoints run in a thread pool
        self.num_refused = 0

    def take(self) -> float | None:
        """Admit one registration (None), or refuse it: the seconds until one would be admitted."""
        with self._lock:
            now_s = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now_s - self._at_s) * self.per_s)
            self._at_s = now_s
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return None
            self.num_refused += 1
            return (1.0 - self._tokens) / self.per_s


def retry_after_header(wait_s: float) -> str:
    """Retry-After takes whole seconds: round up, at least 1."""
    return str(max(1, math.ceil(wait_s)))
