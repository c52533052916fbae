"""The rollout worker's Prometheus series, built at scrape time from the heartbeat it would send now
(throughput, tokens/s, version, last swap), so the metrics and the coordinator see the same numbers,
plus two meters the worker loop keeps: the histogram of every swap's rollout pause (SwapPauses) and how
full the engine's batch was while it decoded (BatchOccupancy)."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from shared.api import HeartbeatRequest
from shared.metrics import PREFIX, gauge

PAUSE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class SwapPauses:
    """Every weight swap's rollout pause (seconds the engine spent loading, WeightSwapReport.pause_s, plus
    in continuous mode the recompute of the rows in flight) as histogram buckets, and the longest;
    observed by the worker loop, read by the scrape thread."""

    def __init__(self) -> None:
        self._counts = [0] * (len(PAUSE_BUCKETS_S) + 1)  # per bucket, the last one +Inf (not cumulative)
        self._sum_s = 0.0
        self._last_s: float | None = None
        self._max_s = 0.0
        self._lock = threading.Lock()

    def observe(self, pause_s: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(PAUSE_BUCKETS_S, pause_s)] += 1
            self._sum_s += pause_s
            self._last_s = pause_s
            self._max_s = max(self._max_s, pause_s)

    def extend_last(self, extra_s: float) -> None:
        """The last swap's pause went on for `extra_s` more (continuous mode: the first decoding step after a
        load recomputes the rows in flight); without a swap observed yet, a pause of its own."""
        with self._lock:
            if self._last_s is None:
                last_s = 0.0
            else:
                last_s = self._last_s
                self._counts[bisect.bisect_left(PAUSE_BUCKETS_S, last_s)] -= 1
                self._sum_s -= last_s
        self.observe(last_s + extra_s)

    def family(self, worker: str) -> HistogramMetricFamily:
        with self._lock:
            counts, sum_s = list(self._counts), self._sum_s
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, PAUSE_BUCKETS_S), "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family = HistogramMetricFamily(
            PREFIX + "worker_swap_pause_seconds",
            "rollout pause per weight swap: seconds the engine spent loading a version instead of generating",
            labels=["worker"],
        )
        family.add_metric([worker], buckets, sum_s)
        return family

    def max_family(self, worker: str) -> Metric:
        with self._lock:
            max_s = self._max_s
        return gauge(
            "worker_swap_pause_max_seconds", "the longest rollout pause of any swap", max_s, {"worker": worker}
        )


class BatchOccupancy:
    """How full the engine's batch was while it decoded: tokens decoded / (row places x decoding steps).
    The row places are the batch's capacity in both modes ([rollout] continuous_max_rows, or
    worker_max_groups_per_batch x group_size per engine call), so a batch call pays both for the finished
    samples riding along until its longest ends and for the places it had no task for; a continuous
    batch pays for the places it had no row for."""

    def __init__(self) -> None:
        self._num_tokens = 0
        self._num_places = 0
        self._lock = threading.Lock()

    def observe(self, num_tokens: int, num_places: int) -> None:
        """One engine call (or decoding step): `num_tokens` decoded on `num_places` row places x steps."""
        with self._lock:
            self._num_tokens += num_tokens
            self._num_places += num_places

    def families(self, worker: str) -> Iterator[Metric]:
        with self._lock:
            num_tokens, num_places = self._num_tokens, self._num_places
        for name, doc, value in (
            ("worker_decoded_tokens", "completion tokens the engine decoded", num_tokens),
            ("worker_batch_places", "row places x decoding steps the engine ran (its batch capacity)", num_places),
        ):
            family = CounterMetricFamily(PREFIX + name, doc, labels=["worker"])
            family.add_metric([worker], value)
            yield family
        if num_places:
            yield gauge(
                "worker_batch_occupancy",
                "decoded tokens / row places x steps, since the worker started",
                num_tokens / num_places,
                {"worker": worker},
            )


def rollout_families(
    worker: str,
    report: HeartbeatRequest,
    pauses: SwapPauses | None = None,
    occupancy: BatchOccupancy | None = None,
) -> Iterator[Metric]:
    """One worker's series, from the heartbeat it would send now (and its swap pauses and occupancy)."""
    labels = {"worker": worker}
    yield gauge(
        "worker_policy_version", "version the engine samples with (-1: none yet)", report.policy_version, labels
    )
    yield gauge(
        "worker_samples_per_second",
        "samples per second of generation time (recent window)",
        report.samples_per_s,
        labels,
    )
    yield gauge(
        "worker_tokens_per_second",
        "completion tokens per second of generation time (recent window)",
        report.tokens_per_s,
        labels,
    )
    yield gauge(
        "worker_group_latency_seconds",
        "mean seconds of one engine call (a batch of groups)",
        report.group_latency_s,
        labels,
    )
    yield gauge(
        "worker_generating",
        "1 while generating, 0 while gated, on standby or waiting for tasks",
        float(report.generating),
        labels,
    )
    groups = CounterMetricFamily(PREFIX + "worker_groups", "groups published", labels=["worker"])
    groups.add_metric([worker], report.num_groups_done)
    yield groups
    swap = report.last_swap
    if swap is not None:
        yield gauge(
            "worker_broadcast_seconds",
            "announcement -> swap of the newest version this worker holds",
            max(0.0, swap.swapped_at_s - swap.announced_at_s),
            labels,
        )
    if pauses is not None:
        yield pauses.family(worker)
        yield pauses.max_family(worker)
    if occupancy is not None:
        yield from occupancy.families(worker)
