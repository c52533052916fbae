"""/v1/operators: join credentials an admin issues, lists and revokes (admin token only; what a credential is
and how quarantine sticks to it: services/coordinator/operators.py).

Revocation drains the credential's active and standby workers rather than quarantining them: it ends an
operator's membership, it is no verdict on the work already done, which the trust score still judges
(a quarantined worker stays quarantined). A draining worker gets no new tasks from the work API at once,
finishes and hands back what it holds, and cannot register again with the revoked credential.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Path, status

from services.coordinator.deps import AdminCallerDep, ControlDep, CoordinatorDep, RegistryDep
from services.coordinator.errors import error_docs
from services.coordinator.operators import OperatorCredentials, UnknownOperatorError
from shared.api import (
    OPERATORS_PATH,
    IssuedOperator,
    IssueOperatorRequest,
    OperatorInfo,
    RevokedOperator,
    WorkerInfo,
    WorkerState,
)

router = APIRouter(prefix=OPERATORS_PATH, tags=["operators"])

OperatorIdPath = Path(min_length=1, max_length=64, description="id from POST /v1/operators")


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_docs(401, 403))
def issue_operator(
    request: IssueOperatorRequest, caller: AdminCallerDep, coordinator: CoordinatorDep
) -> IssuedOperator:
    """A new join credential for `name`; its join token is in this answer only (stored as a sha256). Its
    workers send it in header X-RL-Join-Token (RL_JOIN_TOKEN, `relay-rl worker --token`)."""
    operator, join_token = credentials_of(coordinator).issue(request.name)
    return IssuedOperator(operator=operator, join_token=join_token)


@router.get("", responses=error_docs(401, 403))
def list_operators(caller: AdminCallerDep, coordinator: CoordinatorDep) -> list[OperatorInfo]:
    """Every credential of the run, oldest first, with its state and the workers registered under it."""
    workers = coordinator.registry.list_workers()
    return [with_workers(operator, workers) for operator in credentials_of(coordinator).list_operators()]


@router.get("/{operator_id}", responses=error_docs(401, 403, 404))
def get_operator(
    caller: AdminCallerDep, coordinator: CoordinatorDep, operator_id: str = OperatorIdPath
) -> OperatorInfo:
    return with_workers(find(coordinator, operator_id), coordinator.registry.list_workers())


@router.delete("/{operator_id}", responses=error_docs(401, 403, 404))
def revoke_operator(
    caller: AdminCallerDep,
    coordinator: CoordinatorDep,
    registry: RegistryDep,
    control: ControlDep,
    operator_id: str = OperatorIdPath,
) -> RevokedOperator:
    """Registration (and the bootstrap) with the credential is refused from now on (403), for good: issue
    a new one to let the operator back. Its active and standby workers are drained (module doc).
    Idempotent."""
    find(coordinator, operator_id)  # 404 for an unknown id
    operator = credentials_of(coordinator).revoke(operator_id)
    live = [w.worker_id for w in registry.list_workers() if w.operator_id == operator_id]
    after = registry.set_states(
        {wid: (WorkerState.DRAINING, (WorkerState.ACTIVE, WorkerState.STANDBY)) for wid in live}
    )
    drained = sorted(wid for wid, state in after.items() if state == WorkerState.DRAINING)
    control.request_replan()
    return RevokedOperator(operator=with_workers(operator, registry.list_workers()), drained_worker_ids=drained)


def credentials_of(coordinator: CoordinatorDep) -> OperatorCredentials:
    return OperatorCredentials(coordinator.redis, coordinator.keys)


def find(coordinator: CoordinatorDep, operator_id: str) -> OperatorInfo:
    try:
        return credentials_of(coordinator).get(operator_id)
    except UnknownOperatorError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from exc


def with_workers(operator: OperatorInfo, workers: list[WorkerInfo]) -> OperatorInfo:
    worker_ids = [w.worker_id for w in workers if w.operator_id == operator.operator_id]
    return operator.model_copy(update={"worker_ids": worker_ids})
