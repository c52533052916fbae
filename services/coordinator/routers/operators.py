"""/v1/operators: join credentials an admin issues, lists, budgets, releases and revokes (admin token only; what
a credential is and how quarantine sticks to it: services/coordinator/operators.py; its budget:
services/coordinator/credential_budget.py; its record: services/coordinator/credential_record.py).

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
from services.coordinator.quarantine import NotQuarantinedError
from shared.api import (
    OPERATORS_PATH,
    CredentialBudgetUpdate,
    IssuedOperator,
    IssueOperatorRequest,
    OperatorInfo,
    RevokedOperator,
    WorkerState,
)

router = APIRouter(prefix=OPERATORS_PATH, tags=["operators"])

OperatorIdPath = Path(min_length=1, max_length=64, description="id from POST /v1/operators")


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_docs(401, 403))
def issue_operator(
    request: IssueOperatorRequest, caller: AdminCallerDep, coordinator: CoordinatorDep
) -> IssuedOperator:
    """A new join credential for `name`, with its own `budget` where given (else the run's [credentials]
    defaults); its join token is in this answer only (stored as a sha256). Its workers send it in header
    X-RL-Join-Token (RL_JOIN_TOKEN, `relay-rl worker --token`)."""
    operator, join_token = credentials_of(coordinator).issue(request.name)
    if request.budget is not None:
        coordinator.budgets.set(operator.operator_id, request.budget)
    return IssuedOperator(operator=described(coordinator, operator, None), join_token=join_token)


@router.get("", responses=error_docs(401, 403))
def list_operators(caller: AdminCallerDep, coordinator: CoordinatorDep, control: ControlDep) -> list[OperatorInfo]:
    """Every credential of the run, oldest first, with its state, budget, record and live identities."""
    return [described(coordinator, operator, control) for operator in credentials_of(coordinator).list_operators()]


@router.get("/{operator_id}", responses=error_docs(401, 403, 404))
def get_operator(
    caller: AdminCallerDep, coordinator: CoordinatorDep, control: ControlDep, operator_id: str = OperatorIdPath
) -> OperatorInfo:
    return described(coordinator, find(coordinator, operator_id), control)


@router.patch("/{operator_id}", responses=error_docs(401, 403, 404))
def set_budget(
    update: CredentialBudgetUpdate,
    caller: AdminCallerDep,
    coordinator: CoordinatorDep,
    control: ControlDep,
    operator_id: str = OperatorIdPath,
) -> OperatorInfo:
    """Change the credential's budget (the fields given; the others stay): its cap of live identities, of leases
    held together, its registrations per minute. A lower cap takes no identity away: it refuses the next."""
    operator = find(coordinator, operator_id)
    coordinator.budgets.set(operator_id, update)
    return described(coordinator, operator, control)


@router.post("/{operator_id}/release", responses=error_docs(401, 403, 404, 409))
def release_operator(
    caller: AdminCallerDep, coordinator: CoordinatorDep, control: ControlDep, operator_id: str = OperatorIdPath
) -> OperatorInfo:
    """Release a quarantined credential: it registers workers again, its record is judged afresh from now, and
    each of its workers held in quarantine is released (back to active if its lease still runs). 409 when it
    is not quarantined."""
    find(coordinator, operator_id)
    try:
        operator = control.quarantine.release_credential(operator_id)
    except NotQuarantinedError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    control.request_replan()
    return described(coordinator, operator, control)


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
    live = registry.live_of(operator_id)
    after = registry.set_states(
        {wid: (WorkerState.DRAINING, (WorkerState.ACTIVE, WorkerState.STANDBY)) for wid in live}
    )
    drained = sorted(wid for wid, state in after.items() if state == WorkerState.DRAINING)
    control.request_replan()
    return RevokedOperator(operator=described(coordinator, operator, control), drained_worker_ids=drained)


def credentials_of(coordinator: CoordinatorDep) -> OperatorCredentials:
    return OperatorCredentials(coordinator.redis, coordinator.keys)


def find(coordinator: CoordinatorDep, operator_id: str) -> OperatorInfo:
    try:
        return credentials_of(coordinator).get(operator_id)
    except UnknownOperatorError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from exc


def described(coordinator: CoordinatorDep, operator: OperatorInfo, control: ControlDep | None) -> OperatorInfo:
    """The credential with its live identities, its budget and (given the control plane) its record."""
    operator_id = operator.operator_id
    update = {"worker_ids": coordinator.registry.live_of(operator_id), "budget": coordinator.budgets.of(operator_id)}
    if control is not None:
        update["record"] = control.credentials.record(operator_id)
    return operator.model_copy(update=update)
