"""The rollout worker's Prometheus series, built at scrape time from the heartbeat it would send now
(throughput, tokens/s, version, last swap), so the metrics and the coordinator see the same numbers,
plus the histogram of every swap's rollout pause (SwapPauses, kept by the worker loop)."""

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
    """Every weight swap's rollout pause (seconds the engine spent loading, WeightSwapReport.pause_s) as
    histogram buckets; observed by the worker loop, read by the scrape thread."""

    def __init__(self) -> None:
        self._counts = [0] * (len(PAUSE_BUCKETS_S) + 1)  # per bucket, the last one +Inf (not cumulative)
        self._sum_s = 0.0
        self._lock = threading.Lock()

    def observe(self, pause_s: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(PAUSE_BUCKETS_S, pause_s)] += 1
            self._sum_s += pause_s

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


def rollout_families(worker: str, report: HeartbeatRequest, pauses: SwapPauses | None = None) -> Iterator[Metric]:
    """One worker's series, from the heartbeat it would send now (and its swap pauses)."""
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
