"""The reward service's own Prometheus series (its counters); the stream depths come from
`shared.metrics.stream_depth_families`, which the coordinator serves too."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from shared.metrics import PREFIX, counter


def reward_families(
    num_scored: int,
    num_tasks_published: int,
    text_mismatches_by_worker: Mapping[str, int] | None = None,
    verifier_failures_by_kind: Mapping[str, int] | None = None,
    num_verifier_restarts: int = 0,
    rejected_by_worker: Mapping[tuple[str, str], int] | None = None,
    env_reward_mismatches_by_worker: Mapping[str, int] | None = None,
) -> Iterator[Metric]:
    yield counter("reward_scored_groups", "groups scored and forwarded to the learner", num_scored)
    yield counter("reward_tasks_published", "prompt groups published to the tasks stream", num_tasks_published)
    yield labelled_counter(
        "reward_text_mismatch",
        "samples whose text from the worker differs from the text its token ids decode to (the decoded text is scored)",
        ("worker_id",),
        [((worker,), value) for worker, value in (text_mismatches_by_worker or {}).items()],
    )
    yield labelled_counter(
        "reward_verifier_failures",
        "groups dead-lettered because the verifier timed out, raised, died or returned a bad reward",
        ("kind",),
        [((kind,), value) for kind, value in (verifier_failures_by_kind or {}).items()],
    )
    yield labelled_counter(
        "reward_rejected_groups",
        "groups dead-lettered by the reward service, by worker and reason "
        "(unscorable, invalid_tokens, verifier_timeout, verifier_raised, verifier_died, verifier_bad_reward)",
        ("worker_id", "reason"),
        (rejected_by_worker or {}).items(),
    )
    yield labelled_counter(
        "reward_env_reward_mismatch",
        "multi-turn samples whose worker-claimed env_reward differs from the replay's (the replay's is scored)",
        ("worker_id",),
        [((worker,), value) for worker, value in (env_reward_mismatches_by_worker or {}).items()],
    )
    yield counter(
        "reward_verifier_restarts",
        "verifier processes killed after a hang or found dead, and replaced",
        num_verifier_restarts,
    )


def labelled_counter(
    name: str, documentation: str, labels: tuple[str, ...], values: Iterable[tuple[Sequence[str], int]]
) -> CounterMetricFamily:
    """One counter family; `values`: (label values in the order of `labels`, count) pairs."""
    family = CounterMetricFamily(PREFIX + name, documentation, labels=list(labels))
    for label_values, value in values:
        family.add_metric(list(label_values), value)
    return family
