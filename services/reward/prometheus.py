"""The reward service's own Prometheus series (its counters); the stream depths come from
`shared.metrics.stream_depth_families`, which the coordinator serves too."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from shared.metrics import PREFIX, counter


def reward_families(
    num_scored: int,
    num_tasks_published: int,
    text_mismatches_by_worker: Mapping[str, int] | None = None,
    verifier_failures_by_kind: Mapping[str, int] | None = None,
    num_verifier_restarts: int = 0,
) -> Iterator[Metric]:
    yield counter("reward_scored_groups", "groups scored and forwarded to the learner", num_scored)
    yield counter("reward_tasks_published", "prompt groups published to the tasks stream", num_tasks_published)
    yield labelled_counter(
        "reward_text_mismatch",
        "samples whose text from the worker differs from the text its token ids decode to (the decoded text is scored)",
        "worker_id",
        text_mismatches_by_worker or {},
    )
    yield labelled_counter(
        "reward_verifier_failures",
        "groups dead-lettered because the verifier timed out, raised, died or returned a bad reward",
        "kind",
        verifier_failures_by_kind or {},
    )
    yield counter(
        "reward_verifier_restarts",
        "verifier processes killed after a hang or found dead, and replaced",
        num_verifier_restarts,
    )


def labelled_counter(name: str, documentation: str, label: str, values: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(PREFIX + name, documentation, labels=[label])
    for value_label, value in sorted(values.items()):
        family.add_metric([value_label], value)
    return family
