"""The one policy for outages of Redis or the coordinator: wait them out with exponential backoff.

Every service treats a lost connection the same way (docs/design.md#failure-handling): nothing it has
not acknowledged is lost, so it waits and tries again, with delays that grow from `initial_s` to `max_s`
(with jitter, so a fleet does not come back in lockstep) and reset after a success. Anything that is not
an outage propagates at once.

Two shapes of the same policy:
- `call_with_retry(call, what)`: one call, retried for up to `max_outage_s` and then re-raised (the
  learner, which must not die on a Redis restart but should not hang forever either);
- `Backoff.wait(stop, exc, what)` in a service loop that retries until it is stopped (reward service,
  rollout worker, weight announcements, registration and heartbeats).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis

log = logging.getLogger(__name__)

T = TypeVar("T")

# A Redis that is restarting, unreachable, too slow, or full: worth waiting for. Full: at `maxmemory`
# (policy noeviction, cluster/redis_server.py) Redis refuses every write that may grow memory with an OOM
# error, and a refused MULTI/EXEC or script has no effect at all (no ack without its XADD), while reads,
# acks and trims still go through; the consumers drain and trim, and the writer's retry then succeeds.
# Other Redis errors (a wrong command, a missing group) are bugs and propagate.
REDIS_OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
)


class Backoff:
    """Exponential backoff with jitter: the n-th consecutive delay is uniform in [c/2, c] with
    c = min(max_s, initial_s * 2**n); `reset()` after a success."""

    def __init__(self, initial_s: float = 0.2, max_s: float = 5.0) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.num_failures = 0

    def next_delay_s(self) -> float:
        ceiling_s = min(self.max_s, self.initial_s * 2**self.num_failures)
        self.num_failures += 1
        return random.uniform(ceiling_s / 2, ceiling_s)

    def reset(self) -> None:
        self.num_failures = 0

    def wait(self, stop: threading.Event, exc: BaseException, what: str) -> None:
        """Log the outage and wait the next delay, or less if `stop` is set meanwhile."""
        delay_s = self.next_delay_s()
        log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay_s)
        stop.wait(delay_s)


def call_with_retry(
    call: Callable[[], T],
    what: str,
    *,
    errors: tuple[type[Exception], ...] = REDIS_OUTAGE_ERRORS,
    on_retry: Callable[[], None] | None = None,
    max_outage_s: float = 120.0,
    backoff: Backoff | None = None,
) -> T:
    """`call()`, retried on `errors` with backoff for up to `max_outage_s`, then the last error is raised.
    `on_retry` runs after each failed attempt (e.g. to note that a reply may have been lost)."""
    backoff = backoff or Backoff()
    deadline_s = time.monotonic() + max_outage_s
    while True:
        try:
            return call()
        except errors as exc:
            delay_s = backoff.next_delay_s()
            if time.monotonic() + delay_s > deadline_s:
                raise
            log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay_s)
            if on_retry is not None:
                on_retry()
            time.sleep(delay_s)
