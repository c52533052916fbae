"""The coordinator's metrics in Prometheus text format (served at GET /metrics by routers/control.py), built
from the control loop's last pass (workers, learner, capacity, activation) plus the ledger and stream
depths read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import FastAPI
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.capacity_view import NUM_BROADCASTS, recent_broadcast_s
from services.coordinator.control import ControlPlane, ControlSnapshot
from services.coordinator.measurements import BAD_MEASUREMENTS
from services.coordinator.reachability import REACHABLE, UNREACHABLE, InboundProbes
from services.coordinator.run_view import run_time_use
from shared.api import WorkerState
from shared.metrics import PREFIX, CallbackCollector, gauge, learner_families, new_registry, stream_depth_families
from shared.time_use import TimeUse


def install_metrics(app: FastAPI, control: ControlPlane) -> None:
    """`app.state.metrics_registry`: what GET /metrics exposes, collected at each scrape."""

    def families() -> Iterator[Metric]:
        yield from hostile_input_families(control)
        yield from coordinator_families(control)
        fast_path = getattr(app, "heartbeat_fast_path", None)  # CoordinatorAPI's
        if fast_path is not None:
            yield from heartbeat_families(fast_path.batcher_counts())
        yield from probe_families(app.state.reachability)

    app.state.metrics_registry = new_registry(CallbackCollector(families))


def hostile_input_families(control: ControlPlane) -> Iterator[Metric]:
    """What the coordinator dropped or refused: bad stored measurements, ignored swap reports, throttled
    registrations, pruned workers (issue 10, item 8)."""
    bad = CounterMetricFamily(
        PREFIX + "coordinator_bad_measurements",
        "stored values dropped as non-finite, unparsable or out of bounds (services/coordinator/measurements.py)",
        labels=["source"],
    )
    for source, count in sorted(BAD_MEASUREMENTS.counts().items()):
        bad.add_metric([source], count)
    yield bad
    ignored = CounterMetricFamily(
        PREFIX + "coordinator_ignored_swap_reports",
        "weight swaps reported by workers and ignored: version never announced, or time out of bounds",
        labels=["reason"],
    )
    for reason, count in sorted(control.coordinator.registry.ignored_swaps.counts().items()):
        ignored.add_metric([reason], count)
    yield ignored
    coordinator = control.coordinator
    throttled = CounterMetricFamily(
        PREFIX + "coordinator_registrations_throttled",
        "registrations refused with 429 by a rate limit: a credential's bucket, or an address's (unauthenticated path)",
        labels=["bucket"],
    )
    for kind, count in sorted(coordinator.registration_limits.num_refused.items()):
        throttled.add_metric([kind], count)
    yield throttled
    yield CounterMetricFamily(
        PREFIX + "coordinator_submissions_penalised",
        "submissions refused unread (429) because their worker sent a garbage body (422) just before",
        value=coordinator.submission_penalties.num_refused,
    )
    yield CounterMetricFamily(
        PREFIX + "coordinator_leases_answered_early",
        "lease calls answered empty without Redis: their worker, or its credential, held all it may just before",
        value=coordinator.lease_pacing.num_answered_early,
    )
    yield CounterMetricFamily(
        PREFIX + "coordinator_pruned_workers",
        "dead workers forgotten after the retention period",
        value=control.pruner.num_pruned,
    )


def heartbeat_families(counts: tuple[int, int]) -> Iterator[Metric]:
    num_heartbeats, num_calls = counts
    yield CounterMetricFamily(
        PREFIX + "coordinator_fast_heartbeats", "heartbeats served on the fast path", value=num_heartbeats
    )
    yield CounterMetricFamily(
        PREFIX + "coordinator_heartbeat_script_calls", "Redis calls that carried them (batched)", value=num_calls
    )


def probe_families(probes: InboundProbes) -> Iterator[Metric]:
    """The connect-back probes of the workers' chunk servers (services/coordinator/reachability.py)."""
    outcomes = CounterMetricFamily(
        PREFIX + "coordinator_reachability_probes",
        "probes of workers' chunk servers from the coordinator (TCP connect + GET /healthz), by outcome",
        labels=["outcome"],
    )
    for outcome in (REACHABLE, UNREACHABLE):
        outcomes.add_metric([outcome], probes.num_probes[outcome])
    yield outcomes


def coordinator_families(control: ControlPlane) -> Iterator[Metric]:
    snapshot = control.current()
    coordinator = control.coordinator
    yield from learner_families(snapshot.learner)
    yield from stream_depth_families(coordinator.bus)
    yield from worker_families(snapshot)
    capacity = snapshot.capacity
    if capacity.known:
        yield gauge(
            "capacity_required_samples_per_second",
            "throughput rule R / T_train",
            capacity.required_samples_per_s or 0.0,
        )
        yield gauge(
            "capacity_current_samples_per_second",
            "sum of the active workers' samples/s",
            capacity.current_samples_per_s,
        )
        yield gauge(
            "capacity_predicted_utilization", "capacity model: T_train / P*", capacity.predicted_utilization or 0.0
        )
        yield gauge(
            "capacity_staleness_feasible",
            "1 if S holds with a learner that never waits",
            float(bool(capacity.staleness_feasible)),
        )
    yield gauge("control_pass_seconds", "wall seconds of the control loop's latest pass", control.last_pass_s)
    yield gauge(
        "control_pass_interval_seconds",
        "seconds between periodic passes (stretched when passes are slow)",
        control.pass_interval_s(),
    )
    broadcast_s = recent_broadcast_s(coordinator.redis, coordinator.keys)
    if broadcast_s is not None:
        yield gauge(
            "broadcast_seconds",
            "T_bcast (learner publish start -> engine sampling with the version): mean of the newest measured versions",
            broadcast_s,
        )
    pause_mean_s, pause_max_s = BroadcastTimes(coordinator.redis, coordinator.keys).recent_pause_s(NUM_BROADCASTS)
    if pause_mean_s is not None:
        yield gauge(
            "broadcast_rollout_pause_seconds",
            "rollout pause (engine loading a version): mean per swap over the newest measured versions",
            pause_mean_s,
        )
    if pause_max_s is not None:
        yield gauge(
            "broadcast_rollout_pause_max_seconds",
            "rollout pause (engine loading a version): the longest swap of the newest measured versions",
            pause_max_s,
        )
    yield from time_use_families(run_time_use(coordinator, snapshot.learner, snapshot.workers))
    cost = control.cost(snapshot)
    usd = CounterMetricFamily(PREFIX + "cost_usd", "cumulative cost billed", labels=["component"])
    usd.add_metric(["learner"], cost.learner_usd)
    usd.add_metric(["workers"], cost.workers_usd)
    yield usd
    yield gauge("cost_usd_per_hour", "current burn rate", cost.usd_per_hour_now)


def time_use_families(use: TimeUse | None) -> Iterator[Metric]:
    """Where the time went (shared/time_use.py): seconds by side and what they were spent on, the verdict."""
    if use is None:
        return
    seconds = GaugeMetricFamily(
        PREFIX + "time_seconds",
        "where the run's time went, by side and use (shared/time_use.py)",
        labels=["side", "use"],
    )
    seconds.add_metric(["learner", "train"], use.learner_train_s)
    seconds.add_metric(["learner", "wait_for_data"], use.learner_wait_s)
    seconds.add_metric(["workers", "generate"], use.workers_generating_s)
    seconds.add_metric(["workers", "staleness_gate"], use.workers_gated_s)
    seconds.add_metric(["workers", "wait_for_tasks"], use.workers_waiting_for_tasks_s)
    yield seconds
    if use.weight_sync_p95_s is not None:
        yield gauge("weight_sync_p95_seconds", "T_bcast p95 over the measured versions", use.weight_sync_p95_s)
    yield gauge(
        "stale_tokens_dropped", "completion tokens not trained because they were too old", use.stale_tokens_dropped
    )
    verdict = GaugeMetricFamily(
        PREFIX + "verdict", "1 for the side bounding the run (shared/time_use.py)", labels=["verdict"]
    )
    verdict.add_metric([use.verdict], 1.0)
    yield verdict


def worker_families(snapshot: ControlSnapshot) -> Iterator[Metric]:
    by_state = GaugeMetricFamily(PREFIX + "fleet_workers", "registered workers by state", labels=["state"])
    for state in WorkerState:
        num = snapshot.num_dead if state == WorkerState.DEAD else sum(1 for w in snapshot.workers if w.state == state)
        by_state.add_metric([state.value], num)
    yield by_state
    yield gauge(
        "fleet_workers_unreachable",
        "live workers whose chunk server the coordinator's probe could not reach (NAT, a firewall): relay-plan leaves",
        sum(1 for w in snapshot.workers if w.inbound_reachable is False),
    )
    names = ("samples_per_second", "tokens_per_second", "policy_version", "price_per_hour")
    families = {
        name: GaugeMetricFamily(
            PREFIX + "fleet_worker_" + name, f"per worker: {name.replace('_', ' ')}", labels=["worker", "name", "state"]
        )
        for name in names
    }
    for w in snapshot.workers:
        labels = [w.worker_id, w.name, w.state.value]
        families["samples_per_second"].add_metric(labels, w.samples_per_s)
        families["tokens_per_second"].add_metric(labels, w.tokens_per_s)
        families["policy_version"].add_metric(labels, w.policy_version)
        families["price_per_hour"].add_metric(labels, w.price_per_hour)
    yield from families.values()
    forged = CounterMetricFamily(
        PREFIX + "fleet_worker_rollouts_forged",
        "per worker: rollouts claiming it whose producer_mac did not verify (dead-lettered by the reward service)",
        labels=["worker", "name", "state"],
    )
    for w in snapshot.workers:
        forged.add_metric([w.worker_id, w.name, w.state.value], w.num_rollouts_forged)
    yield forged
    yield from trust_families(snapshot)


def trust_families(snapshot: ControlSnapshot) -> Iterator[Metric]:
    """The learner's trust per worker (docs/trust.md): score and whether it is suspect."""
    trust = snapshot.learner.trust_by_worker if snapshot.learner is not None else {}
    score = GaugeMetricFamily(PREFIX + "fleet_worker_trust_score", "per worker: trust score (CUSUM)", labels=["worker"])
    suspect = GaugeMetricFamily(PREFIX + "fleet_worker_trust_suspect", "per worker: 1 if suspect", labels=["worker"])
    for worker_id, worker in trust.items():
        score.add_metric([worker_id], worker.score)
        suspect.add_metric([worker_id], float(worker.suspect))
    yield score
    yield suspect
