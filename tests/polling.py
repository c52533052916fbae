"""Waiting in tests: poll a condition until it holds or a timeout passes; never sleep a fixed time.

`wait_for` returns the condition's first truthy value, so a test waits for a result and uses it in one
step; on timeout it fails naming what it waited for. `CallCounter` lets a test watch a service loop
take turns, which is how it shows that something did *not* happen although the loop had every chance
to do it ("two more turns and the gated task is still untouched"), instead of sleeping and hoping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    what: str,
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.02,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call `condition` every `interval_s` until it returns something truthy, and return that value.
    After `timeout_s` fail with an AssertionError naming `what` (plus `explain()`, e.g. a log tail).
    An exception raised by `condition` propagates at once: a condition can fail fast (a dead process)."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline_s:
            details = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for: {what}{details}")
        time.sleep(interval_s)


class CallCounter:
    """Counts the calls of one method of a live object, from whatever thread makes them. It replaces
    the method on that instance only (the class is untouched); calls run the original unchanged."""

    def __init__(self, owner: object, method_name: str) -> None:
        self._method = getattr(owner, method_name)
        self._lock = threading.Lock()
        self.num_returned = 0  # calls that returned
        self.num_raised = 0  # calls that raised (e.g. a service loop's turn during a Redis outage)
        setattr(owner, method_name, self._counted)

    def _counted(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self._method(*args, **kwargs)
        except BaseException:
            with self._lock:
                self.num_raised += 1
            raise
        with self._lock:
            self.num_returned += 1
        return result

    def wait_for_more(self, num_calls: int, what: str, *, timeout_s: float = 30.0) -> None:
        """Wait until `num_calls` more calls have returned than had now. With 2, at least one whole
        call ran after this point (the first may have been under way already)."""
        target = self.num_returned + num_calls
        wait_for(lambda: self.num_returned >= target, what, timeout_s=timeout_s)
