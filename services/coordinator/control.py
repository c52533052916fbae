"""The control loop: prune the long dead -> keep the credentials' records (fold, reconcile, shares) -> flag by
the work accounting, identities and credentials -> quarantine -> measure -> assess capacity -> plan
activation -> apply states -> bill verified work -> record history.

Runs every `activation.replan_interval_s`, and at once when membership changes (join, drain, leave).
A pass reads every live worker's record (O(N): ~60 ms at 1000 workers, ~3x that on a starved host; the dead
are not read: thousands of them, a registration flood's, cost a pass nothing), in a
thread of the process that also serves heartbeats; passes are spaced so they take at most
MAX_PASS_DUTY of the time, which at 1000 workers stretches the interval past one second rather than
let passes slow heartbeats for a tenth of every second (benchmarks/load_heartbeat.py).
Everything it decides lands in Redis (worker states, the ledger, the history), so any coordinator
on the same Redis serves the same answers; what it keeps in memory (the learner window, the last
snapshot) is a cache a restarted coordinator rebuilds within a minute.

States it moves: STANDBY <-> ACTIVE, and any live state -> QUARANTINED for a worker the learner reports
as suspect, or that the work accounting flags for its completion ratio ([work] quarantine_incomplete;
quarantine.py; only an admin's release moves it back). DRAINING and DEAD are never touched (draining is the
operator's or the worker's call, dead is the lease's), so a planner racing a drain cannot undo it.

The learner as the coordinator sees it (`LearnerView`: its version and S, read from `learner:state`)
is defined here too: a pass caches it, and heartbeat answers read it from the last pass.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.capacity_view import (
    LearnerWindow,
    MeasuredInputs,
    measure_inputs,
    queued_groups,
    recent_broadcast_s,
)
from services.coordinator.credential_record import CredentialBooks
from services.coordinator.ledger import CostLedger, WorkerBill
from services.coordinator.measurements import BAD_MEASUREMENTS, sane_learner_state
from services.coordinator.operators import OperatorCredentials
from services.coordinator.pruning import DeadWorkerPruner
from services.coordinator.quarantine import Quarantine
from services.coordinator.work_flags import fleet_median_completion, outliers_against
from shared.activation import ActivationPlan, ActivationPolicy, Candidate, plan_activation
from shared.api import (
    ActivationInfo,
    CapacityInputsInfo,
    CapacityResponse,
    CostResponse,
    HistoryPoint,
    RegisterWorkerRequest,
    WorkerInfo,
    WorkerState,
)
from shared.bus import StreamBus
from shared.capacity import assess, provisioning_samples_per_s
from shared.config import RunConfig
from shared.messages import LearnerState, MessageDecodeError
from shared.streams import LEARNER_STATE

if TYPE_CHECKING:  # deps.py imports this module (ControlDep)
    from services.coordinator.deps import Coordinator

log = logging.getLogger(__name__)

MAX_HISTORY_POINTS = 2000
MIN_PASS_GAP_S = 0.2  # one pass reads every worker record: O(N), ~50 ms at 1000 workers
MAX_PASS_DUTY = 0.05  # passes take at most this fraction of the time (the periodic ones; not joins/drains)
BILLED_STATES = (WorkerState.ACTIVE, WorkerState.DRAINING)
RUNNING_LEARNER_STATUSES = ("starting", "training")


@dataclass(frozen=True)
class LearnerView:
    """Where the learner is now. Before the learner has written any state it is at version 0 (the
    initial weights) and the run file's staleness bound applies."""

    learner_version: int
    staleness_bound: int
    state: LearnerState | None  # None: the learner has not started yet


def read_learner_view(bus: StreamBus, run: RunConfig) -> LearnerView:
    """The learner's `LearnerState`, which the learner keeps under one key, read now (an undecodable one,
    or one holding a bad number, is read as no state, and counted: services/coordinator/measurements.py)."""
    try:
        state = sane_learner_state(bus.get_state(LEARNER_STATE))
    except MessageDecodeError as exc:
        BAD_MEASUREMENTS.count("learner.state", str(exc))
        state = None
    if state is None:
        return LearnerView(learner_version=0, staleness_bound=run.schedule.staleness_bound, state=None)
    # the learner applies the admission rule, so its S is the one that holds (it read the same run file)
    return LearnerView(learner_version=state.learner_version, staleness_bound=state.staleness_bound, state=state)


@dataclass(frozen=True)
class ControlSnapshot:
    """What the last pass saw and decided; the endpoints answer from it."""

    at_s: float
    workers: list[WorkerInfo]
    learner: LearnerState | None
    measured: MeasuredInputs
    capacity: CapacityResponse
    activation: ActivationInfo | None
    num_dead: int = 0  # dead workers not pruned yet (`workers` holds the live ones)


class ControlPlane:
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.config = coordinator.run.activation
        self.policy = ActivationPolicy(
            margin=self.config.margin,
            hysteresis=self.config.hysteresis,
            min_dwell_s=self.config.min_dwell_s,
            assumed_samples_per_s=self.config.assumed_samples_per_s,
            activate_free_workers=self.config.activate_free_workers,
        )
        self.ledger = CostLedger(
            coordinator.redis,
            coordinator.keys,
            max_billing_gap_s=self.config.max_billing_gap_s,
            verified_work_window_s=coordinator.run.verified_work_window_s,
        )
        self.window = LearnerWindow()
        self.pruner = DeadWorkerPruner(coordinator.registry, coordinator.run.coordinator.dead_worker_retention_s)
        self.credentials = CredentialBooks(
            coordinator.redis, coordinator.keys, coordinator.work, window=coordinator.run.max_groups_in_flight
        )
        self.quarantine = Quarantine(
            coordinator.bus,
            coordinator.registry,
            coordinator.access,
            coordinator.run.run_id,
            books=coordinator.work.books,
            credential_books=self.credentials,
            min_ended_leases=coordinator.run.work.quarantine_min_ended_leases,
        )
        self._dead_indexed = False
        self.clock = time.time  # unix seconds of billing and dwell times (tests replace it)
        self.snapshot: ControlSnapshot | None = None
        self._lock = threading.Lock()  # one pass at a time (the loop's thread and on-demand passes)
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_history_version = -1
        self.last_pass_s = 0.0  # wall seconds of the loop's latest pass

    # the loop
    async def run_forever(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while True:
            started_s = time.monotonic()
            try:
                await asyncio.to_thread(self.run_once)
            except redis.RedisError as exc:  # Redis down or restarting: try again next tick
                log.warning("control pass failed: %s", exc)
            except Exception:  # boundary: a failed pass is logged and retried; the API keeps serving
                log.exception("control pass failed")
            self.last_pass_s = time.monotonic() - started_s
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.pass_interval_s())
            except TimeoutError:
                pass
            # a burst of joins (or a thousand workers registering) runs a pass at most every MIN_PASS_GAP_S
            await asyncio.sleep(max(0.0, started_s + MIN_PASS_GAP_S - time.monotonic()))
            self._wake.clear()

    def pass_interval_s(self) -> float:
        return pass_interval_s(self.config.replan_interval_s, self.last_pass_s)

    def request_replan(self) -> None:
        """Membership changed: run a pass now (callable from any thread)."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def run_once(self, now_s: float | None = None) -> ControlSnapshot:
        with self._lock:
            now_s = self.clock() if now_s is None else now_s
            c = self.coordinator
            self.prune()
            workers = c.registry.list_live()
            c.registry.announcements.ingest()  # the learner's announcements: what swap reports may name
            self.complete_broadcasts(workers)
            learner = read_learner_view(c.bus, c.run).state
            self.window.observe(learner)
            self.credentials.upkeep(workers, c.registry.clock())
            flagged, flagged_credentials = self.flag(workers)
            # before planning: a quarantined worker is neither active nor standby
            policy = c.run.work.quarantine_incomplete
            workers = self.quarantine.apply(
                learner if c.run.trust.enabled else None,
                workers,
                flagged if policy else {},
                flagged_credentials if policy else {},
            )
            # billing: a flagged credential's identities are flagged with it
            flagged = {**flagged, **{w.worker_id: "" for w in workers if w.operator_id in flagged_credentials}}
            broadcast_s, num_queued = recent_broadcast_s(c.redis, c.keys), queued_groups(c.bus)
            measured = measure_inputs(c.run, learner, self.window, workers, broadcast_s, num_queued)
            activation = None
            if self.config.enabled:
                plan = self.plan(workers, measured, now_s)
                workers = self.apply(plan, workers)
                activation = activation_info(plan, now_s)
            else:
                workers = self.apply_all_active(workers)
            self.bill(now_s, learner, workers, flagged)
            self.record_history(learner, now_s)
            # the capacity answer describes the active set just decided
            measured = measure_inputs(c.run, learner, self.window, workers, broadcast_s, num_queued)
            self.snapshot = ControlSnapshot(
                now_s, workers, learner, measured, capacity_response(measured), activation, c.registry.num_dead()
            )
            return self.snapshot

    def current(self) -> ControlSnapshot:
        """The last pass, or a fresh one if none ran yet."""
        return self.snapshot or self.run_once()

    def learner_view(self) -> LearnerView:
        """The learner's version and S as of the last pass (read from Redis when no pass ran yet)."""
        snapshot = self.snapshot
        c = self.coordinator
        if snapshot is None:
            return read_learner_view(c.bus, c.run)
        if snapshot.learner is None:  # not started yet: version 0 under the run file's bound
            return LearnerView(0, c.run.schedule.staleness_bound, None)
        return LearnerView(snapshot.learner.learner_version, snapshot.learner.staleness_bound, snapshot.learner)

    # steps
    def prune(self) -> None:
        """Forget workers dead longer than the retention period (services/coordinator/pruning.py); their
        lease time is the registry's clock. The first pass indexes dead records older coordinators left."""
        registry = self.coordinator.registry
        if not self._dead_indexed:
            if num := registry.index_the_dead():
                log.info("indexed %d dead workers of an older coordinator for pruning", num)
            self._dead_indexed = True
        self.pruner.prune(registry.clock())

    def flag(self, workers: list[WorkerInfo]) -> tuple[dict[str, str], dict[str, str]]:
        """(workers, credentials) flagged for their completion since their last release: each live identity, and
        each issued credential's record, against the fleet's median identity (services/coordinator/work_flags.py)."""
        c = self.coordinator
        identities = c.work.books.counts_since_release(w.worker_id for w in workers)
        median = fleet_median_completion(identities)
        flagged = outliers_against(identities, median) if median is not None else {}
        issued = OperatorCredentials(c.redis, c.keys).ids()
        return flagged, self.credentials.flags(issued, median)

    def complete_broadcasts(self, workers: list[WorkerInfo]) -> None:
        """T_bcast of every version all active workers have swapped in (heartbeats only record the swaps)."""
        completed = BroadcastTimes(self.coordinator.redis, self.coordinator.keys).complete_pending(workers)
        for version, seconds in sorted(completed.items()):
            log.info("version %d reached every active worker in %.3fs", version, seconds)

    def plan(self, workers: list[WorkerInfo], measured: MeasuredInputs, now_s: float) -> ActivationPlan:
        candidates = [
            Candidate(
                worker_id=w.worker_id,
                price_per_hour=w.price_per_hour,
                samples_per_s=w.samples_per_s,
                gpu_type=w.gpu_type,
                active=w.state == WorkerState.ACTIVE,
                state_since_s=w.state_since_s,
            )
            for w in workers
            if w.state in (WorkerState.ACTIVE, WorkerState.STANDBY)
        ]
        required = provisioning_samples_per_s(measured.inputs) if measured.inputs is not None else None
        return plan_activation(candidates, required, self.policy, now_s)

    def apply(self, plan: ActivationPlan, workers: list[WorkerInfo]) -> list[WorkerInfo]:
        """Write the plan's state changes; returns the workers as they are now."""
        current_active = {w.worker_id for w in workers if w.state == WorkerState.ACTIVE}
        to_activate, to_standby = plan.changes(current_active)
        changes = {wid: (WorkerState.ACTIVE, (WorkerState.STANDBY,)) for wid in to_activate}
        changes |= {wid: (WorkerState.STANDBY, (WorkerState.ACTIVE,)) for wid in to_standby}
        if not changes:
            return workers
        after = self.coordinator.registry.set_states(changes)
        log.info("activation (%s): active +%s standby +%s", plan.reason, sorted(to_activate), sorted(to_standby))
        return [w.model_copy(update={"state": after[w.worker_id]}) if after.get(w.worker_id) else w for w in workers]

    def apply_all_active(self, workers: list[WorkerInfo]) -> list[WorkerInfo]:
        standby = [w.worker_id for w in workers if w.state == WorkerState.STANDBY]
        if standby:
            self.coordinator.registry.set_states({wid: (WorkerState.ACTIVE, (WorkerState.STANDBY,)) for wid in standby})
        return [w.model_copy(update={"state": WorkerState.ACTIVE}) if w.worker_id in standby else w for w in workers]

    def bill(
        self, now_s: float, learner: LearnerState | None, workers: list[WorkerInfo], flagged: Collection[str]
    ) -> None:
        """The learner while it runs; each priced worker for its active time backed by verified work (groups the
        reward service scored), none while it is flagged (services/coordinator/ledger.py)."""
        learner_running = learner is not None and learner.status in RUNNING_LEARNER_STATUSES
        billed = [w for w in workers if w.state in BILLED_STATES and w.price_per_hour > 0]
        verified = self.coordinator.work.books.rewards(w.worker_id for w in billed)
        self.ledger.bill(
            now_s,
            self.config.learner_price_per_hour if learner_running else 0.0,
            {
                w.worker_id: WorkerBill(w.price_per_hour, verified[w.worker_id].num_groups, w.worker_id in flagged)
                for w in billed
            },
        )

    def record_history(self, learner: LearnerState | None, now_s: float) -> None:
        if learner is None or learner.learner_version == self._last_history_version or learner.num_steps_done == 0:
            return
        self._last_history_version = learner.learner_version
        point = HistoryPoint(
            learner_version=learner.learner_version,
            reward_mean=learner.last_reward_mean,
            utilization=learner.busy_fraction,
            cost_usd=self.ledger.totals().total_usd,
            at_s=now_s,
        )
        key = self.coordinator.keys.learner_history
        with self.coordinator.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, point.model_dump_json())
            pipe.ltrim(key, -MAX_HISTORY_POINTS, -1)
            pipe.execute()

    # answers
    def history(self) -> list[HistoryPoint]:
        """The dashboard's points; one that does not parse as a HistoryPoint of finite numbers is left out (counted)."""
        raw = self.coordinator.redis.lrange(self.coordinator.keys.learner_history, 0, -1)
        points = []
        for item in raw:
            try:
                point = HistoryPoint.model_validate_json(item)
            except ValueError:  # pydantic's ValidationError is one
                BAD_MEASUREMENTS.count("learner.history", item)
                continue
            if all(math.isfinite(v) for v in (point.reward_mean, point.utilization, point.cost_usd, point.at_s)):
                points.append(point)
            else:
                BAD_MEASUREMENTS.count("learner.history", item)
        return points

    def cost(self, snapshot: ControlSnapshot) -> CostResponse:
        totals = self.ledger.totals()
        learner_running = snapshot.learner is not None and snapshot.learner.status in RUNNING_LEARNER_STATUSES
        burn = (self.config.learner_price_per_hour if learner_running else 0.0) + sum(
            w.price_per_hour for w in snapshot.workers if w.state in BILLED_STATES
        )
        return CostResponse(
            total_usd=totals.total_usd,
            learner_usd=totals.learner_usd,
            workers_usd=totals.workers_usd,
            usd_by_worker=totals.usd_by_worker,
            unverified_usd=totals.unverified_usd,
            usd_per_hour_now=burn,
            learner_price_per_hour=self.config.learner_price_per_hour,
            billed_until_s=totals.billed_until_s,
        )

    def initial_state(self, request: RegisterWorkerRequest) -> WorkerState:
        """A joining worker's state until the next pass: free ones (and everyone while activation is off
        or the requirement is unknown) start active; a priced one waits on standby, so nothing is
        spent on it before the planner has decided."""
        if not self.config.enabled or (self.config.activate_free_workers and request.price_per_hour == 0):
            return WorkerState.ACTIVE
        snapshot = self.snapshot
        if snapshot is None or snapshot.measured.inputs is None:
            return WorkerState.ACTIVE
        return WorkerState.STANDBY


def pass_interval_s(replan_interval_s: float, pass_s: float) -> float:
    """Seconds from one periodic pass to the next: the configured interval, or longer when a pass is
    slow enough that it would take more than MAX_PASS_DUTY of the time."""
    return max(replan_interval_s, pass_s / MAX_PASS_DUTY)


def capacity_response(measured: MeasuredInputs) -> CapacityResponse:
    inputs = measured.inputs
    if inputs is None:
        return CapacityResponse(
            known=False,
            required_samples_per_s=None,
            overlap_required_samples_per_s=None,
            provisioning_samples_per_s=None,
            current_samples_per_s=0.0,
            predicted_step_s=None,
            predicted_utilization=None,
            measured_utilization=None,
            max_lag_steps=None,
            min_feasible_staleness=None,
            staleness_feasible=None,
            admissible_fraction=None,
            starved=None,
            inputs=None,
        )
    result = assess(inputs)
    times = measured.step_times
    measured_utilization = None
    if times is not None and times.train_s + times.overhead_s + times.idle_s > 0:
        measured_utilization = times.train_s / (times.train_s + times.overhead_s + times.idle_s)
    return CapacityResponse(
        known=True,
        required_samples_per_s=result.required_samples_per_s,
        overlap_required_samples_per_s=_finite(result.overlap_required_samples_per_s),
        provisioning_samples_per_s=_finite(result.provisioning_samples_per_s),
        current_samples_per_s=result.current_samples_per_s,
        predicted_step_s=_finite(result.predicted_step_s),
        predicted_utilization=result.predicted_utilization,
        measured_utilization=measured_utilization,
        max_lag_steps=result.max_lag_steps if math.isfinite(result.predicted_step_s) else None,
        min_feasible_staleness=result.min_feasible_staleness,
        staleness_feasible=result.staleness_feasible,
        admissible_fraction=result.admissible_fraction,
        starved=result.starved,
        inputs=CapacityInputsInfo(
            samples_per_step=inputs.samples_per_step,
            train_s=inputs.train_s,
            step_overhead_s=inputs.step_overhead_s,
            broadcast_s=inputs.broadcast_s,
            group_latency_s=inputs.group_latency_s,
            queue_delay_s=inputs.queue_delay_s,
            publish_every=inputs.publish_every,
            staleness_bound=inputs.staleness_bound,
            worker_samples_per_s=dict(measured.active_samples_per_s),
            sources=measured.sources,
        ),
    )


def activation_info(plan: ActivationPlan, now_s: float) -> ActivationInfo:
    return ActivationInfo(
        enabled=True,
        target_samples_per_s=_finite(plan.target_samples_per_s),
        planned_samples_per_s=plan.planned_samples_per_s,
        planned_price_per_hour=plan.planned_price_per_hour,
        active_worker_ids=sorted(plan.active_ids),
        standby_worker_ids=sorted(plan.standby_ids),
        estimated_samples_per_s=plan.estimates,
        reason=plan.reason,
        planned_at_s=now_s,
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
