"""The rollout worker's Prometheus series, built at scrape time from the heartbeat it would send now
(throughput, tokens/s, version, last swap), so the metrics and the coordinator see the same numbers."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from shared.api import HeartbeatRequest
from shared.metrics import PREFIX, gauge


def rollout_families(worker: str, report: HeartbeatRequest) -> Iterator[Metric]:
    """One worker's series, from the heartbeat it would send now."""
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
