"""The learner's policy for Redis outages: retry with backoff, then give up loudly.

A Redis restart (AOF on) must not kill a learner that holds minutes of training since its last
checkpoint, so every Redis call of the learner goes through `call_with_retry`. Anything other than
a connection problem propagates at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE = (redis.ConnectionError, redis.TimeoutError)


def call_with_retry(
    call: Callable[[], T],
    what: str,
    *,
    on_retry: Callable[[], None] | None = None,
    max_outage_s: float = 120.0,
    first_backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
) -> T:
    """`call()`, retried on connection errors with exponential backoff for up to `max_outage_s`.
    `on_retry` runs after each failed attempt (e.g. to note that a reply may have been lost)."""
    deadline_s = time.monotonic() + max_outage_s
    backoff_s = first_backoff_s
    while True:
        try:
            return call()
        except RETRYABLE as exc:
            if time.monotonic() + backoff_s > deadline_s:
                raise
            log.warning("redis unavailable during %s (%s); retrying in %.1fs", what, exc, backoff_s)
            if on_retry is not None:
                on_retry()
            time.sleep(backoff_s)
            backoff_s = min(2 * backoff_s, max_backoff_s)
