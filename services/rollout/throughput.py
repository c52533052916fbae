"""What a worker tells the coordinator of its speed: samples and tokens per second of generation time."""

from __future__ import annotations

import time
from collections import deque


class ThroughputMeter:
    """Samples (and tokens) per second of generation time over the last `window_s` seconds (capacity,
    not idle time), and the mean latency of one engine call (L_gen of the capacity model)."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        # (ended at, num_samples, generation_s, num_tokens)
        self._batches: deque[tuple[float, int, float, int]] = deque()
        self.generation_s_total = 0.0  # every engine call's seconds since the start (shared/time_use.py)

    def record(self, num_samples: int, generation_s: float, num_tokens: int = 0) -> None:
        now_s = time.monotonic()
        self.generation_s_total += generation_s
        self._batches.append((now_s, num_samples, generation_s, num_tokens))
        while self._batches and self._batches[0][0] < now_s - self.window_s:
            self._batches.popleft()

    def samples_per_s(self) -> float:
        batches = list(self._batches)
        busy_s = sum(batch[2] for batch in batches)
        return sum(batch[1] for batch in batches) / busy_s if busy_s > 0 else 0.0

    def tokens_per_s(self) -> float:
        batches = list(self._batches)
        busy_s = sum(batch[2] for batch in batches)
        return sum(batch[3] for batch in batches) / busy_s if busy_s > 0 else 0.0

    def mean_batch_s(self) -> float:
        batches = list(self._batches)
        return sum(batch[2] for batch in batches) / len(batches) if batches else 0.0
