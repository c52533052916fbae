"""A clock that moves only when the test says so: lease and billing tests advance it by hand instead of
waiting real seconds, so they are exact and instant."""

from __future__ import annotations


class ManualClock:
    """Unix seconds that move only when the test says so (callable like `time.time`)."""

    def __init__(self, now_s: float = 1_000_000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
