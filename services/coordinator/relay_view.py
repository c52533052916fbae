"""The relay plan as the coordinator serves it: who fetches the next weight version from whom.

The plan is computed on every read from the registry (alive workers, their reported bandwidth) and the
throughput each achieved on past versions, so it follows joins, drains and deaths with no state of its
own (shared/relay_plan.py holds the rule). Swap reports arrive with heartbeats and become T_bcast in
services/coordinator/broadcast_times.py. Served by services/coordinator/routers/broadcast.py.
"""

from __future__ import annotations

import logging

from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.deps import Coordinator
from services.coordinator.worker_registry import WorkerDeadError
from shared.api import (
    ParentResponse,
    RelayAssignmentInfo,
    RelayPlanResponse,
    WorkerInfo,
    WorkerState,
)
from shared.chunk_client import announced_source
from shared.messages import MessageDecodeError
from shared.relay_plan import LEARNER, RelayCandidate, RelayPlan, plan_relay
from shared.streams import WEIGHTS
from shared.weights import WeightsError

log = logging.getLogger(__name__)

# who is in the plan (fetches from it and relays): active workers and standbys, which keep their
# weights fresh anyway; a draining worker is leaving and a dead one is gone
RELAY_STATES = (WorkerState.ACTIVE, WorkerState.STANDBY)


def relay_plan_response(coordinator: Coordinator) -> RelayPlanResponse:
    """The whole plan, each assignment with the bandwidth it was ranked by (reported and measured)."""
    workers = coordinator.registry.list_workers()
    measured = BroadcastTimes(coordinator.redis, coordinator.keys).measured_mbps()
    plan = compute_plan(coordinator, workers, measured)
    learner_url = read_learner_url(coordinator)
    by_id = {w.worker_id: w for w in workers}
    return RelayPlanResponse(
        learner_url=learner_url,
        num_seeds=coordinator.run.broadcast.relay_num_seeds,
        fanout=coordinator.run.broadcast.relay_fanout,
        max_depth=plan.max_depth,
        assignments=[
            RelayAssignmentInfo(
                worker_id=a.worker_id,
                name=by_id[a.worker_id].name,
                parent_id=a.parent_id,
                parent_url=a.parent_url or learner_url,
                depth=a.depth,
                reported_mbps=by_id[a.worker_id].bandwidth_mbps,
                measured_mbps=measured.get(a.worker_id),
                fallback_urls=list(a.fallback_urls),
            )
            for a in plan.assignments.values()
        ],
    )


def parent_response(coordinator: Coordinator, worker_id: str) -> ParentResponse:
    """`worker_id`'s place in the plan; the learner, with the relayers as fallbacks, for a worker alive
    but outside it. Raises UnknownWorkerError, or WorkerDeadError for a dead worker."""
    worker = coordinator.registry.get(worker_id)
    if worker.state == WorkerState.DEAD:
        raise WorkerDeadError(f"worker {worker_id} is dead (its lease expired); register again")
    workers = coordinator.registry.list_workers()
    plan = compute_plan(coordinator, workers, BroadcastTimes(coordinator.redis, coordinator.keys).measured_mbps())
    learner_url = read_learner_url(coordinator)
    assignment = plan.parent_of(worker_id)
    if assignment is None:
        relayers = sorted(plan.assignments.values(), key=lambda a: a.depth)
        fallbacks = [
            w.endpoint_url for w in workers if w.worker_id in {a.worker_id for a in relayers} and w.endpoint_url
        ]
        return ParentResponse(
            worker_id=worker_id,
            parent_id=LEARNER,
            parent_url="",
            depth=1,
            fallback_urls=fallbacks[:8],
            learner_url=learner_url,
        )
    return ParentResponse(
        worker_id=worker_id,
        parent_id=assignment.parent_id,
        parent_url=assignment.parent_url,
        depth=assignment.depth,
        fallback_urls=list(assignment.fallback_urls),
        learner_url=learner_url,
    )


def compute_plan(coordinator: Coordinator, workers: list[WorkerInfo], measured_mbps: dict[str, float]) -> RelayPlan:
    candidates = [
        RelayCandidate(
            worker_id=w.worker_id,
            endpoint_url=w.endpoint_url,
            reported_mbps=w.bandwidth_mbps,
            measured_mbps=measured_mbps.get(w.worker_id),
            alive=w.state in RELAY_STATES,
        )
        for w in workers
    ]
    config = coordinator.run.broadcast
    return plan_relay(candidates, num_seeds=config.relay_num_seeds, fanout=config.relay_fanout)


def read_learner_url(coordinator: Coordinator) -> str:
    """The learner's chunk server as the newest announcement names it; '' before any (or if unreadable)."""
    try:
        announcement = coordinator.bus.latest(WEIGHTS)
        if announcement is None:
            return ""
        base_url, _ = announced_source(announcement)
    except (MessageDecodeError, WeightsError) as exc:
        log.warning("newest weights announcement is unusable: %s", exc)
        return ""
    return base_url
