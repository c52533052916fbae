"""/v1/workers: registration, heartbeats (leases), drain, deregistration, listing.

Lifecycle: register (active, or standby when it has a price and the planner has not picked it yet)
-> heartbeats; the answer carries the state the control loop decided (active / standby / draining)
-> drain (own token or admin): the worker finishes its batch, acks it, deregisters and exits
-> gone. A worker that stops heartbeating is dead after `lease_s` and must register again (as itself:
`previous_worker_id` + its old token; services/coordinator/join.py). A dead worker's record is pruned
`dead_worker_retention_s` after its lease ran out (services/coordinator/pruning.py). Listings are pages:
the live workers, then the dead, newest first (GET /v1/workers?state=&operator_id=&limit=&offset=).

How a heartbeat is served, fast path and this endpoint, step by step: services/coordinator/heartbeat_path.py.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from services.coordinator.auth import AdminCaller, Caller, WorkerCaller
from services.coordinator.control import read_learner_view
from services.coordinator.deps import (
    BearerTokenDep,
    CallerDep,
    ControlDep,
    CoordinatorDep,
    JoinTokenDep,
    ProbesDep,
    RegistryDep,
    WorkerIdPath,
)
from services.coordinator.errors import error_docs
from services.coordinator.join import admit_registration, join_or_rejoin
from services.coordinator.operators import OperatorCredentials
from shared.api import (
    MAX_WORKERS_PAGE,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterWorkerRequest,
    RegisterWorkerResponse,
    WorkerInfo,
    WorkerState,
)

router = APIRouter(prefix="/v1/workers", tags=["workers"])


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_docs(401, 403, 409, 429))
def register_worker(
    request: RegisterWorkerRequest,
    http: Request,
    coordinator: CoordinatorDep,
    control: ControlDep,
    probes: ProbesDep,
    join_token: JoinTokenDep = None,
    bearer_token: BearerTokenDep = None,
) -> RegisterWorkerResponse:
    """Join the run, with a join token in header X-RL-Join-Token: the cluster's, or a join credential an
    admin issued (POST /v1/operators), whose id the worker then carries (401 without one; 403 when that
    credential is revoked or quarantined; 429 when the credential's registrations come faster than its rate
    limit, or it holds its cap of live workers: retry after Retry-After). The answer carries the worker's id
    and its bearer token (shown once, stored only as a sha256). The lease starts now: heartbeat every
    `heartbeat_interval_s`, well within `lease_s`.
    `state` is where it starts: active,
    or standby until cost-aware activation picks it (heartbeat answers carry every later decision).
    A worker whose lease ran out rejoins as itself: `previous_worker_id` in the body and its previous
    token as `Authorization: Bearer` (403 if the token is not that worker's); see services/coordinator/join.py.
    Its `endpoint_url` is probed from here at once and every minute after: the relay plan makes it a parent
    only while that chunk server answers (`inbound_reachable`; services/coordinator/reachability.py)."""
    operators = OperatorCredentials(coordinator.redis, coordinator.keys)
    admission = admit_registration(
        join_token,
        coordinator.join_token_sha256,
        operators,
        coordinator.registration_limits,
        coordinator.budgets,
        http.client.host if http.client is not None else "",
        coordinator.open_registration,
    )
    quarantined = control.quarantine.current().worker_ids if request.previous_worker_id else []
    initial_state = control.initial_state(request)
    joined = join_or_rejoin(
        coordinator.registry,
        request,
        bearer_token,
        initial_state,
        quarantined,
        admission.operator_id,
        admission.budget.max_workers,
    )
    access = coordinator.access.grant(joined.worker_id)  # after the lease exists: services/coordinator/redis_access.py
    control.request_replan()
    probes.request(joined.worker_id, joined.info.endpoint_url)  # a parent once its chunk server answers
    run = coordinator.run
    return RegisterWorkerResponse(
        worker_id=joined.worker_id,
        token=joined.token,
        run_id=run.run_id,
        lease_s=run.coordinator.lease_s,
        heartbeat_interval_s=run.rollout.heartbeat_interval_s,
        staleness_bound=read_learner_view(coordinator.bus, run).staleness_bound,
        state=joined.info.state,
        rejoined=joined.rejoined,
        access=access,
    )


@router.post("/{worker_id}/heartbeat", responses=error_docs(401, 403, 404, 410))
def heartbeat(
    worker_id: WorkerIdPath,
    request: HeartbeatRequest,
    caller: CallerDep,
    coordinator: CoordinatorDep,
    control: ControlDep,
) -> HeartbeatResponse:
    """Extend the lease by `lease_s` and report progress; the answer carries the state the control loop
    decided (active / standby / draining) and the learner's version as of its last pass. 410 means the
    lease had already expired: the worker is dead to the run and must register again. (A worker's own
    heartbeat is served in one Redis round trip by services/coordinator/heartbeat_path.py, which leaves
    every other case to this endpoint.)"""
    coordinator.registry.ensure_known(worker_id)
    ensure_is_worker(caller, worker_id)
    state, lease_expires_at_s = coordinator.registry.extend_lease(worker_id, request)
    learner = control.learner_view()
    return HeartbeatResponse(
        state=state,
        lease_expires_at_s=lease_expires_at_s,
        learner_version=learner.learner_version,
        staleness_bound=learner.staleness_bound,
    )


@router.delete("/{worker_id}", status_code=status.HTTP_204_NO_CONTENT, responses=error_docs(401, 403, 404))
def deregister_worker(
    worker_id: WorkerIdPath, caller: CallerDep, coordinator: CoordinatorDep, control: ControlDep
) -> Response:
    """Leave the run (with the worker's own token), or remove a worker (with the admin token). Its Redis
    access is revoked at once."""
    registry = coordinator.registry
    registry.ensure_known(worker_id)
    if not isinstance(caller, AdminCaller):
        ensure_is_worker(caller, worker_id)
    registry.deregister(worker_id)
    coordinator.access.revoke(worker_id)
    control.request_replan()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{worker_id}/drain", responses=error_docs(401, 403, 404, 410))
def drain_worker(worker_id: WorkerIdPath, caller: CallerDep, registry: RegistryDep, control: ControlDep) -> WorkerInfo:
    """Ask a worker to leave gracefully (its own token, or the admin token). It is DRAINING at once: it
    takes no new tasks and drops out of the relay plan; its next heartbeat answer tells it, and it
    finishes the batch in hand (published and acked), deregisters and exits. Idempotent. Tasks it
    had read but not finished are never lost: unacked entries stay pending and another worker
    claims them. 410 for a dead worker."""
    registry.ensure_known(worker_id)
    if not isinstance(caller, AdminCaller):
        ensure_is_worker(caller, worker_id)
    info = registry.drain(worker_id)
    control.request_replan()
    return info


@router.get("")
def list_workers(
    registry: RegistryDep,
    response: Response,
    state: Annotated[WorkerState | None, Query(description="only workers in this state")] = None,
    operator_id: Annotated[
        str | None, Query(max_length=64, description='only identities of this join credential ("": the shared token)')
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_WORKERS_PAGE, description="workers in this page at most")] = 200,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="workers to skip")] = 0,
) -> list[WorkerInfo]:
    """A page of the registered workers: the live ones (oldest registration first), then the dead (most
    recently dead first), `limit` from `offset`. The header X-Total-Count says how many match; a page costs
    O(live workers + limit), however many dead identities a registration flood left behind."""
    live = [w for w in registry.list_live() if (state is None or w.state == state)]
    if operator_id is not None:
        live = [w for w in live if w.operator_id == operator_id]
    page = live[offset : offset + limit]
    num_dead = 0
    if state in (None, WorkerState.DEAD):
        num_dead = registry.num_dead()
        if operator_id is None:
            page += registry.list_dead(limit - len(page), max(0, offset - len(live)))
        else:  # a credential's dead identities: filtered from the newest dead, a bounded scan
            dead = [w for w in registry.list_dead(MAX_WORKERS_PAGE) if w.operator_id == operator_id]
            num_dead = len(dead)
            page += dead[max(0, offset - len(live)) :][: limit - len(page)]
    response.headers["X-Total-Count"] = str(len(live) + num_dead)
    return page


@router.get("/{worker_id}", responses=error_docs(404))
def get_worker(worker_id: WorkerIdPath, registry: RegistryDep) -> WorkerInfo:
    return registry.get(worker_id)


def ensure_is_worker(caller: Caller, worker_id: str) -> None:
    """403 unless the caller holds `worker_id`'s own token."""
    if isinstance(caller, WorkerCaller) and caller.worker_id == worker_id:
        return
    who = "the admin token" if isinstance(caller, AdminCaller) else "a token of another worker"
    raise HTTPException(status.HTTP_403_FORBIDDEN, detail=f"{who} cannot act as worker {worker_id}")
