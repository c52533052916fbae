"""/v1/work: the work API, a rollout worker's only way to the streams (contract: shared/work_api.py; the
stream operations and their checks: services/coordinator/work_leases.py). Workers hold no Redis
credentials; every call carries the worker's own bearer token (the admin token is no worker's: 403).

    lease      an active worker takes up to `max_groups` tasks; it backs off when it gets none. Naming its
               engine's `policy_version`, it first gets up to `max_eval_groups` eval tasks of exactly that
               version (held-out evaluation: services/coordinator/eval_leases.py)
    rollouts   it answers its leases: each group is accepted (on to `rollouts`, its task acked) or refused
               (dead-lettered with the reason, the lease left as it was)
    failures   it gives back a task it cannot serve (engine error): dead-lettered and acked; an eval lease
               is handed back to the version's other workers instead, without penalty
    accounting the admin reads the counters per worker and in total
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status
from starlette.concurrency import run_in_threadpool

from services.coordinator.body_limit import received_body
from services.coordinator.deps import AdminCallerDep, CoordinatorDep, RegistryDep, WorkerCallerDep, WorkLeasesDep
from services.coordinator.errors import error_docs
from services.coordinator.lease_pacing import Full
from services.coordinator.work_leases import LeaseRefusedError
from services.coordinator.worker_registry import UnknownWorkerError, WorkerDeadError
from shared.messages import MessageDecodeError
from shared.work_api import (
    ACCOUNTING_PATH,
    FAILURES_PATH,
    LEASE_PATH,
    MAX_SUBMISSION_BYTES,
    MSGPACK_CONTENT_TYPE,
    ROLLOUTS_PATH,
    SUBMISSION_DECODE_LIMITS,
    LeaseRequest,
    LeaseResponse,
    SubmitResponse,
    TaskFailure,
    WorkAccounting,
    WorkSubmission,
)

router = APIRouter(tags=["work"])


@router.post(LEASE_PATH, responses=error_docs(401, 403, 404, 410))
def lease_tasks(
    request: LeaseRequest,
    caller: WorkerCallerDep,
    work: WorkLeasesDep,
    registry: RegistryDep,
    coordinator: CoordinatorDep,
) -> LeaseResponse:
    """Up to `max_groups` tasks, answering at once (maybe with none: back off before asking again). Leases
    another worker let expire come first. A worker, and its join credential, hold no more than they have
    earned (2 leases when new, one more per scored group, up to `[work] max_held_tasks` and the credential's
    budget: services/coordinator/work_scripts.py): past it, none until it answers some (or they expire and go
    to others). Standby, draining and quarantined workers, and those of a quarantined credential, get none; a
    dead worker gets 410 (register again). A worker that got none because it, or its credential, held all it may
    gets its next calls answered empty for a while, until it answers or fails a lease
    (services/coordinator/lease_pacing.py).

    With `policy_version` (the version its engine holds), eval tasks of exactly that version come first, up to
    `max_eval_groups` (a TaskGroup with `eval_version`: decode it greedily with that version, answer it naming
    `eval_version`); they count apart from the training leases and their limits."""
    try:
        now_s = registry.clock()
        evals = []
        if request.policy_version is not None and request.max_eval_groups > 0:
            evals = work.lease_evals(caller.worker_id, request.policy_version, request.max_eval_groups, now_s)
        tasks, full = work.lease_or_full(caller.worker_id, request.max_groups, now_s)
        tasks = evals + tasks
        coordinator.lease_pacing.note(caller.worker_id, Full.NOT if evals else full)
    except LeaseRefusedError as exc:
        if exc.state == "unknown":
            raise UnknownWorkerError(f"no worker {caller.worker_id} is registered") from exc
        if exc.state == "dead":
            raise WorkerDeadError(f"worker {caller.worker_id} is dead (its lease expired); register again") from exc
        tasks = []  # standby, draining or quarantined: no tasks, heartbeats say when that changes
    return LeaseResponse(lease_s=work.lease_s, tasks=tasks)


@router.post(
    ROLLOUTS_PATH,
    responses=error_docs(401, 403) | {413: {"description": "body over the run's limit (max_submission_bytes)"}},
    openapi_extra={"requestBody": {"content": {MSGPACK_CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def submit_rollouts(
    request: Request, caller: WorkerCallerDep, work: WorkLeasesDep, coordinator: CoordinatorDep
) -> SubmitResponse:
    """A msgpack WorkSubmission (shared/work_api.py): groups answering the caller's leases. Each is
    accepted or refused on its own; a refused group is dead-lettered with its reason. 415 for another
    content type, 422 for a body that is no WorkSubmission of this run or breaks its decode limits (the
    detail names the limit), 413 over the body limit.

    The body and each group are decoded within limits (SUBMISSION_DECODE_LIMITS, then the task's:
    shared/rollout_limits.py) and in a worker thread, so no body costs more than those allow, and the event
    loop keeps serving every other request meanwhile. After a 422 the caller's next submissions get 429 for a
    while, unread (services/coordinator/submission_penalty.py)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != MSGPACK_CONTENT_TYPE:
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, detail=f"send {MSGPACK_CONTENT_TYPE}")
    async with received_body(request, MAX_SUBMISSION_BYTES) as body:  # unmapped once its groups are copied out
        try:
            submission = await run_in_threadpool(WorkSubmission.decode, body, SUBMISSION_DECODE_LIMITS)
        except MessageDecodeError as exc:
            coordinator.submission_penalties.strike(caller.worker_id)
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)[:1000]) from exc
    if submission.run_id != work.keys.run_id:
        coordinator.submission_penalties.strike(caller.worker_id)
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=f"this coordinator runs {work.keys.run_id}")
    coordinator.submission_penalties.clear(caller.worker_id)
    coordinator.lease_pacing.clear(caller.worker_id)
    return await run_in_threadpool(work.submit, caller.worker_id, submission.groups)


@router.post(FAILURES_PATH, status_code=status.HTTP_204_NO_CONTENT, responses=error_docs(401, 403, 409))
def report_failure(
    failure: TaskFailure,
    caller: WorkerCallerDep,
    work: WorkLeasesDep,
    registry: RegistryDep,
    coordinator: CoordinatorDep,
) -> Response:
    """The caller cannot serve the task of this lease (an engine error): it is dead-lettered with `error`
    and acked, counted `failed` against the caller; a task it took while still earning its allowance goes
    back to other workers instead. Either way its allowance halves. An eval lease (`eval_version`) is handed
    back to the version's other workers, without penalty. 409 when the caller does not hold the lease."""
    coordinator.lease_pacing.clear(caller.worker_id)
    outcome = work.fail(caller.worker_id, failure.lease_id, failure.error, registry.clock(), failure.eval_version)
    if outcome is None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"lease {failure.lease_id} is not held by this worker")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(ACCOUNTING_PATH, responses=error_docs(401, 403))
def work_accounting(caller: AdminCallerDep, work: WorkLeasesDep) -> WorkAccounting:
    """Admin token only: per worker and in total, tasks leased, groups returned, accepted and refused,
    leases expired, tasks failed, and leases held now (leased = accepted + failed + expired + held); the
    rewards of each worker's scored groups; the workers flagged for their completion ratio (quarantined by
    policy) and for their mean reward (a signal only)."""
    return work.accounting()
