"""Weight broadcast: the relay plan (who fetches from whom), each worker's parent, and the measured
T_bcast per version. The plan is computed in services/coordinator/relay_view.py, T_bcast recorded in
services/coordinator/broadcast_times.py."""

from __future__ import annotations

from fastapi import APIRouter

from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.deps import CoordinatorDep, WorkerIdPath
from services.coordinator.errors import error_docs
from services.coordinator.relay_view import parent_response, relay_plan_response
from shared.api import BroadcastTimesResponse, ParentResponse, RelayPlanResponse

router = APIRouter(tags=["broadcast"])


@router.get("/v1/broadcast/plan")
def relay_plan(coordinator: CoordinatorDep) -> RelayPlanResponse:
    """Every active or standby worker's parent (the learner for the seeds, other workers for the rest),
    depth and fallbacks, ranked by effective bandwidth."""
    return relay_plan_response(coordinator)


@router.get("/v1/workers/{worker_id}/parent", responses=error_docs(404, 410))
def worker_parent(worker_id: WorkerIdPath, coordinator: CoordinatorDep) -> ParentResponse:
    """Where `worker_id` fetches the next version from. A worker that is alive but not in the plan
    (draining) gets the learner, with the plan's relayers as fallbacks. 410 for a dead worker."""
    return parent_response(coordinator, worker_id)


@router.get("/v1/broadcast/times")
def broadcast_times(coordinator: CoordinatorDep) -> BroadcastTimesResponse:
    """Measured T_bcast per version: the learner's publication start to the (n - f)-th counted worker's swap
    (services/coordinator/broadcast_times.py)."""
    return BroadcastTimes(coordinator.redis, coordinator.keys).summary()
