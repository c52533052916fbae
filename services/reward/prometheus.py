"""The reward service's own Prometheus series (its counters); the stream depths come from
`shared.metrics.stream_depth_families`, which the coordinator serves too."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from shared.metrics import counter


def reward_families(num_scored: int, num_tasks_published: int) -> Iterator[Metric]:
    yield counter("reward_scored_groups", "groups scored and forwarded to the learner", num_scored)
    yield counter("reward_tasks_published", "prompt groups published to the tasks stream", num_tasks_published)
