"""/v1/workers/{id}/release: an admin lets a quarantined worker back in (docs/trust.md; the decision to
quarantine is the control loop's, services/coordinator/quarantine.py)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from services.coordinator.auth import AdminCaller
from services.coordinator.deps import CallerDep, ControlDep, WorkerIdPath
from services.coordinator.errors import error_docs
from services.coordinator.quarantine import NotQuarantinedError
from services.coordinator.worker_registry import UnknownWorkerError
from shared.api import ReleaseResponse, WorkerState

router = APIRouter(prefix="/v1/workers", tags=["workers"])


@router.post("/{worker_id}/release", responses=error_docs(401, 403, 404, 409))
def release_worker(worker_id: WorkerIdPath, caller: CallerDep, control: ControlDep) -> ReleaseResponse:
    """Admin token only. The worker goes back to active (dead if its lease ran out meanwhile), its groups are
    trained on again, and the learner resets its trust score. 409 when it is not quarantined."""
    if not isinstance(caller, AdminCaller):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="only the admin token can release a worker")
    try:
        released = control.quarantine.release(worker_id)
    except NotQuarantinedError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    control.request_replan()
    try:
        state = control.coordinator.registry.get(worker_id).state
    except UnknownWorkerError:  # it deregistered while quarantined: its id is released all the same
        state = WorkerState.DEAD
    return ReleaseResponse(worker_id=worker_id, state=state, num_releases=released.num_releases[worker_id])
