"""The run as a whole, as the coordinator answers about it: the staleness verdict (/v1/staleness, the
worker gate: is version v still admissible?), the status (/v1/status, the run at a glance) and the
dashboard's data (/v1/dashboard: the control loop's last pass + ledger + history)."""

from __future__ import annotations

from collections import Counter

from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.control import ControlPlane, read_learner_view
from services.coordinator.deps import Coordinator
from services.coordinator.ledger import CostLedger
from shared.api import (
    STATUS_MAX_WORKERS,
    DashboardResponse,
    LearnerInfo,
    StalenessResponse,
    StatusResponse,
    WorkerInfo,
    WorkerState,
)
from shared.bus import StreamBus
from shared.messages import LearnerState
from shared.staleness import is_admissible, steps_remaining
from shared.streams import DEAD, GROUPED_STREAMS
from shared.time_use import TimeUse, WorkerTimeUse, time_use


def staleness_verdict(coordinator: Coordinator, policy_version: int) -> StalenessResponse:
    """The admission rule (shared/staleness.py) applied to the learner's version now."""
    learner = read_learner_view(coordinator.bus, coordinator.run)
    return StalenessResponse(
        policy_version=policy_version,
        learner_version=learner.learner_version,
        staleness_bound=learner.staleness_bound,
        admissible=is_admissible(learner.learner_version, policy_version, learner.staleness_bound),
        steps_remaining=steps_remaining(learner.learner_version, policy_version, learner.staleness_bound),
    )


def status_response(coordinator: Coordinator) -> StatusResponse:
    """Read now from Redis (not from the control loop's last pass): the learner, streams, workers, ledger. The
    workers: every live one's record is read (to count them by state), STATUS_MAX_WORKERS are listed, live first,
    then the most recently dead; the dead are counted, never read whole."""
    learner = read_learner_view(coordinator.bus, coordinator.run)
    num_dead_letters = coordinator.bus.length(DEAD)
    registry = coordinator.registry
    live = registry.list_live()
    listed = live[:STATUS_MAX_WORKERS] + registry.list_dead(STATUS_MAX_WORKERS - len(live))
    by_state = Counter(w.state.value for w in live)
    if num_dead := registry.num_dead():
        by_state[WorkerState.DEAD.value] = num_dead
    return StatusResponse(
        run_id=coordinator.run.run_id,
        staleness_bound=learner.staleness_bound,
        learner=None if learner.state is None else LearnerInfo.of(learner.state),
        stream_depths={**stream_depths(coordinator.bus), "dead": num_dead_letters},
        num_dead_letters=num_dead_letters,
        workers=listed,
        num_workers_by_state=dict(sorted(by_state.items())),
        cost_usd=CostLedger(coordinator.redis, coordinator.keys, max_billing_gap_s=1.0).totals().total_usd,
        time_use=run_time_use(coordinator, learner.state, listed),
    )


def dashboard_response(control: ControlPlane) -> DashboardResponse:
    """The control loop's last pass, with stream depths, history and cost read now."""
    snapshot = control.current()
    coordinator = control.coordinator
    learner = snapshot.learner
    bus_depths = stream_depths(coordinator.bus)
    return DashboardResponse(
        run_id=coordinator.run.run_id,
        staleness_bound=learner.staleness_bound if learner is not None else coordinator.run.schedule.staleness_bound,
        learner=LearnerInfo.of(learner) if learner is not None else None,
        workers=snapshot.workers,
        staleness_histogram=dict(learner.staleness_histogram) if learner is not None else {},
        stream_depths={**bus_depths, "dead": coordinator.bus.length(DEAD)},
        history=control.history(),
        capacity=snapshot.capacity,
        activation=snapshot.activation,
        cost=control.cost(snapshot),
        trust_by_worker=dict(learner.trust_by_worker) if learner is not None else {},
        time_use=run_time_use(coordinator, learner, snapshot.workers),
    )


def run_time_use(coordinator: Coordinator, learner: LearnerState | None, workers: list[WorkerInfo]) -> TimeUse | None:
    """Where the time went (shared/time_use.py): the learner's state, the workers' heartbeat counters, the
    measured broadcasts. None before the learner's first state."""
    if learner is None:
        return None
    broadcast = BroadcastTimes(coordinator.redis, coordinator.keys).summary()
    return time_use(
        learner_wall_s=learner.wall_s,
        learner_train_s=learner.train_s_total,
        learner_wait_s=learner.idle_s_total,
        num_steps=learner.num_steps_done,
        workers=[
            WorkerTimeUse(
                generating_s=w.generating_s_total,
                gated_s=w.gated_s_total,
                waiting_for_tasks_s=w.waiting_for_tasks_s_total,
            )
            for w in workers
        ],
        weight_sync_s=broadcast.seconds_by_version.values(),
        swap_pause_mean_s=broadcast.pause_mean_s,
        stale_tokens_dropped=learner.num_stale_tokens_dropped,
        synchronous=coordinator.run.schedule.mode == "pull",
    )


def stream_depths(bus: StreamBus) -> dict[str, int]:
    """Per stream: entries its consumer group has not finished (never delivered plus pending)."""
    return {stream.name: bus.backlog(stream) for stream in GROUPED_STREAMS}
