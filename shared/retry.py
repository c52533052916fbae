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

What counts as an outage is `is_redis_outage(exc)`, for every caller: the classes redis-py raises for one
(REDIS_OUTAGE_ERRORS), and the same replies when a path surfaced them as a plain ResponseError. Code that
reads Redis replies itself, without redis-py's parser, turns an error reply into redis-py's class with
`redis_reply_error` (services/coordinator/redis_script.py), so a LOADING reply is a BusyLoadingError there
too.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis._parsers.base import BaseParser

log = logging.getLogger(__name__)

T = TypeVar("T")

# A Redis that is restarting, unreachable, too slow, or full: worth waiting for. Full: at `maxmemory`
# (policy noeviction, cluster/redis_server.py) Redis refuses every write that may grow memory with an OOM
# error, and a refused MULTI/EXEC or script has no effect at all (no ack without its XADD), while reads,
# acks and trims still go through; the consumers drain and trim, and the writer's retry then succeeds.
# Restarting includes a Redis replaying its AOF: until its data is loaded it answers every command with a
# LOADING error, which redis-py raises as BusyLoadingError, a ConnectionError.
# Other Redis errors (a wrong command, a missing group) are bugs and propagate.
REDIS_OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
)

# how a redis-py pipeline prefixes the error reply of its n-th command (Pipeline.annotate_exception)
_PIPELINE_ANNOTATION = re.compile(r"^Command # \d+ \(.*\) of pipeline caused error: ", re.DOTALL)


def redis_reply_error(reply: str) -> redis.RedisError:
    """The exception redis-py raises for the error reply `reply` ("LOADING Redis is loading ..."), from
    redis-py's own table: LOADING -> BusyLoadingError, OOM -> OutOfMemoryError, NOSCRIPT -> NoScriptError,
    anything not in it a plain ResponseError. For code that parses replies itself: raising every error
    reply as a plain ResponseError hides an outage from each `except REDIS_OUTAGE_ERRORS` (the heartbeat's
    hot path answered 500 while Redis replayed its AOF)."""
    error = BaseParser.parse_error(reply)
    assert isinstance(error, redis.RedisError), type(error)
    return error


def as_redis_outage(exc: BaseException) -> BaseException | None:
    """`exc` as the Redis outage it is (one of REDIS_OUTAGE_ERRORS), None when it is none: itself, or for
    a ResponseError whose message is an outage's error reply (a LOADING or OOM reply that reached us
    unclassified, also as a pipeline reports it: "Command # 2 (XADD ...) of pipeline caused error:
    LOADING ..."), the class redis-py gives that reply (BusyLoadingError, OutOfMemoryError)."""
    if isinstance(exc, REDIS_OUTAGE_ERRORS):
        return exc
    if not isinstance(exc, redis.ResponseError) or not exc.args:
        return None
    classified = redis_reply_error(_PIPELINE_ANNOTATION.sub("", str(exc.args[0]), count=1))
    return classified if isinstance(classified, REDIS_OUTAGE_ERRORS) else None


def is_redis_outage(exc: BaseException) -> bool:
    """Whether `exc` is a Redis outage to wait out (`as_redis_outage`); anything else is a bug."""
    return as_redis_outage(exc) is not None


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
    is_outage: Callable[[Exception], bool] = is_redis_outage,
    on_retry: Callable[[], None] | None = None,
    max_outage_s: float = 120.0,
    backoff: Backoff | None = None,
) -> T:
    """`call()`, retried with backoff while it fails with an outage (`is_outage`) for up to `max_outage_s`,
    then the last error is raised; any other error at once.
    `on_retry` runs after each failed attempt (e.g. to note that a reply may have been lost)."""
    backoff = backoff or Backoff()
    deadline_s = time.monotonic() + max_outage_s
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_outage(exc):
                raise
            delay_s = backoff.next_delay_s()
            if time.monotonic() + delay_s > deadline_s:
                raise
            log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay_s)
            if on_retry is not None:
                on_retry()
            time.sleep(delay_s)
