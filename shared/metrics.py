"""Prometheus metrics of every service, built at scrape time from the typed state each service already
keeps (no counters scattered through the loops). Names start with `relayrl_`; seconds and totals
follow Prometheus conventions.

    learner      LearnerState (the same message it writes to Redis after every step): `learner_families`,
                 here because the coordinator serves it too; the last step's diagnostics are generated
                 from StepDiagnostics' fields (`step_diagnostics_families`)
    reward       stream depths (`stream_depth_families`, served by the coordinator too) and its counters
                 (services/reward/prometheus.py)
    rollout      the HeartbeatRequest it would send now (services/rollout/prometheus.py)
    coordinator  serves /metrics on its own port (services/coordinator/prometheus.py) with the same helpers

`start_metrics_server(port, collector)` serves one collector on `RL_METRICS_PORT` (0: off) from a
daemon thread and returns the bound port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from shared.messages import LearnerState, MetricName, StepDiagnostics
from shared.streams import DEAD, GROUPED_STREAMS

if TYPE_CHECKING:
    from shared.bus import StreamBus

log = logging.getLogger(__name__)

PREFIX = "relayrl_"


class CallbackCollector(Collector):
    """A collector whose families come from a function called at every scrape."""

    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self.families()
        except Exception as exc:  # boundary: a failed scrape must not kill the service; it shows as missing series
            log.warning("metrics scrape failed: %s: %s", type(exc).__name__, exc)


def new_registry(*collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def start_metrics_server(port: int, *collectors: Collector, host: str = "127.0.0.1") -> int | None:
    """Serve `collectors` at http://host:port/metrics; port 0 means off (returns None)."""
    if port == 0:
        return None
    server, _ = start_http_server(port, addr=host, registry=new_registry(*collectors))
    bound_port = server.server_port
    log.info("prometheus metrics on http://%s:%d/metrics", host, bound_port)
    return bound_port


def gauge(name: str, documentation: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, documentation, value=value)


# learner
def learner_families(state: LearnerState | None) -> Iterator[Metric]:
    if state is None:
        return
    yield gauge("learner_version", "policy version t (learner steps taken)", state.learner_version)
    yield gauge("learner_published_version", "newest announced policy version", state.published_version)
    yield counter("learner_steps", "learner steps (batches, versions) taken in this run", state.num_steps_done)
    yield counter("learner_train_seconds", "seconds spent in optimizer steps", state.train_s_total)
    yield counter("learner_idle_seconds", "seconds spent waiting for admissible rollouts", state.idle_s_total)
    yield gauge("learner_busy_fraction", "train seconds / wall seconds so far", state.busy_fraction)
    yield gauge("learner_last_reward_mean", "mean reward of the last step's batch", state.last_reward_mean)
    yield gauge("learner_staleness_bound", "S", state.staleness_bound)
    if state.last_step is not None:
        yield from step_diagnostics_families(state.last_step)
    trained = CounterMetricFamily(PREFIX + "learner_trained_groups", "groups trained on, by lag t - v", labels=["lag"])
    for lag, count in sorted(state.staleness_histogram.items(), key=lambda item: int(item[0])):
        trained.add_metric([lag], count)
    yield trained
    dropped = CounterMetricFamily(
        PREFIX + "learner_dropped_groups", "groups refused by the admission rule, by reason", labels=["reason"]
    )
    for reason, count in sorted(state.num_dropped.items()):
        dropped.add_metric([reason], count)
    yield dropped
    yield from zero_variance_families(state)
    yield from engine_mismatch_families(state)


def step_diagnostics_families(last_step: StepDiagnostics) -> Iterator[Metric]:
    """One gauge per field of StepDiagnostics, relayrl_learner_last_<name> (or its MetricName), its help the
    field's description: a diagnostic added there shows here with no edit."""
    for name, field in StepDiagnostics.model_fields.items():
        metric_name = next((m.name for m in field.metadata if isinstance(m, MetricName)), name)
        yield gauge(f"learner_last_{metric_name}", f"last step: {field.description}", getattr(last_step, name))


def zero_variance_families(state: LearnerState) -> Iterator[Metric]:
    """The last step's worth of groups with zero reward variance (no gradient), and the learner's alarm."""
    flat = state.last_flat_groups
    yield gauge(
        "learner_last_zero_variance_fraction",
        "last step's worth of groups: those whose samples all got the same reward (zero advantage) / all",
        flat.zero_variance_fraction,
    )
    flat_by_reward = GaugeMetricFamily(
        PREFIX + "learner_last_flat_groups",
        "last step's worth of groups: those with zero reward variance, by the reward",
        labels=["reward"],
    )
    for reward, count in (("0", flat.num_flat_at_zero), ("1", flat.num_flat_at_max), ("other", flat.num_flat_other)):
        flat_by_reward.add_metric([reward], count)
    yield flat_by_reward
    yield gauge(
        "learner_last_groups_per_trained_group",
        "last step's worth of groups: groups looked at per group trained (dynamic sampling's cost; 1 without it)",
        flat.groups_per_trained_group,
    )
    yield gauge(
        "learner_zero_variance_warning",
        "1 while the learner warns that nearly every group has zero reward variance (the run cannot learn)",
        float(state.zero_variance_warning is not None),
    )


def engine_mismatch_families(state: LearnerState) -> Iterator[Metric]:
    """The last step's behaviour-vs-recomputed log-prob gap by worker (only workers with lag-0 groups in it)."""
    abs_diff = GaugeMetricFamily(
        PREFIX + "learner_engine_mismatch_logprob_abs_diff",
        "last step: mean |behaviour - recomputed| log-prob over the worker's lag-0 tokens (nats)",
        labels=["worker"],
    )
    kl = GaugeMetricFamily(
        PREFIX + "learner_engine_mismatch_kl",
        "last step: KL(behaviour || recomputed), k3 estimator, over the worker's lag-0 tokens",
        labels=["worker"],
    )
    for worker_id, mismatch in sorted(state.mismatch_by_worker.items()):
        abs_diff.add_metric([worker_id], mismatch.logprob_abs_diff_mean)
        kl.add_metric([worker_id], mismatch.kl_k3)
    yield abs_diff
    yield kl


# streams (reward service and coordinator)
def stream_depth_families(bus: StreamBus) -> Iterator[Metric]:
    depth = GaugeMetricFamily(
        PREFIX + "stream_depth", "entries not finished by the stream's consumer group", labels=["stream"]
    )
    for stream in GROUPED_STREAMS:
        depth.add_metric([stream.name], bus.backlog(stream))
    depth.add_metric(["dead"], bus.length(DEAD))
    yield depth
