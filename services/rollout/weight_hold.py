"""An experiment's knob, never a production setting: workers that keep their weights a few versions
behind on purpose, so the staleness ablation (benchmarks/ablation/) trains on lags spread over 0..S.

On a fast local cluster every worker swaps to each version within milliseconds, and the lags the
learner sees are set by the data plane's queue alone (nearly all groups at one lag). With
`[rollout] hold_versions_max = H`, after each swap the worker draws h uniformly from 0..H and keeps
sampling with its weights until the newest announced version is more than h ahead; then it loads the
newest verified version (the fetch itself never waits: only the swap is held back). Lags at sampling
then cover 0..H, and the learner's admission rule and the staleness gate apply unchanged.
"""

from __future__ import annotations

import random


class WeightHold:
    def __init__(self, hold_versions_max: int, seed: int | None = None) -> None:
        self.hold_versions_max = hold_versions_max
        self._rng = random.Random(seed)
        self.hold_versions = 0
        self.redraw()

    @property
    def active(self) -> bool:
        return self.hold_versions_max > 0

    def releases(self, engine_version: int, newest_version: int | None) -> bool:
        """May the worker swap now? Always before its first weights, and when the knob is off."""
        if self.hold_versions_max == 0 or engine_version < 0 or newest_version is None:
            return True
        return newest_version - engine_version > self.hold_versions

    def redraw(self) -> None:
        """After a swap: how far behind the next swap waits for."""
        self.hold_versions = self._rng.randint(0, self.hold_versions_max)
