"""What an endpoint can ask for, as typed aliases; the routers (services/coordinator/routers/) take them
from here and nowhere else.

    CoordinatorDep   the `Coordinator`: run config, Redis keys and client, worker registry, stream bus, rollout keys
    RegistryDep      its `WorkerRegistry`
    WorkLeasesDep    its `WorkLeases`: tasks leased to workers and their answers (services/coordinator/work_leases.py)
    ControlDep       the `ControlPlane` (services/coordinator/control.py): the control loop's last pass
    ProbesDep        the `InboundProbes` (services/coordinator/reachability.py): who can be reached from outside
    CallerDep        who holds the bearer token: `AdminCaller` or `WorkerCaller` (401 for anyone else)
    WorkerCallerDep  a `WorkerCaller` only (403 for the admin token: the admin is no worker)
    AdminCallerDep   an `AdminCaller` only (403 for a worker's token)
    BearerTokenDep   the bearer token as sent, unchecked (None: no Authorization header)
    JoinTokenDep     the X-RL-Join-Token header as sent, unchecked (None: absent)
    WorkerIdPath     the `{worker_id}` path parameter
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import redis
from fastapi import Depends, Header, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.coordinator.auth import AdminCaller, Caller, InvalidTokenError, WorkerCaller, authenticate
from services.coordinator.control import ControlPlane
from services.coordinator.credential_budget import Budgets
from services.coordinator.lease_pacing import LeasePacing
from services.coordinator.reachability import InboundProbes
from services.coordinator.redis_access import RedisAccess
from services.coordinator.registration_limit import RegistrationLimits
from services.coordinator.submission_penalty import SubmissionPenalties
from services.coordinator.work_leases import WorkLeases
from services.coordinator.worker_registry import WorkerRegistry
from shared.api import JOIN_TOKEN_HEADER, ClusterBootstrap
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys


@dataclass(frozen=True)
class Coordinator:
    """Everything the endpoints share; built once per app by `create_app`. Holds no run state itself:
    that all lives in Redis, so two coordinator processes on one Redis agree."""

    run: RunConfig
    keys: RunKeys
    redis: redis.Redis
    registry: WorkerRegistry
    bus: StreamBus
    admin_token_sha256: str
    join_token_sha256: str | None  # the cluster's shared token's; None: there is none
    open_registration: bool  # anyone registers, as the shared identity unless a credential is presented (dev)
    registration_limits: (
        RegistrationLimits  # per credential and per address (services/coordinator/registration_limit.py)
    )
    budgets: Budgets  # what each join credential may hold (services/coordinator/credential_budget.py)
    submission_penalties: SubmissionPenalties  # garbage submitters refused a while (submission_penalty.py)
    lease_pacing: LeasePacing  # workers holding all they may answered empty a while (lease_pacing.py)
    access: RedisAccess  # workers' rollout-signing keys (services/coordinator/redis_access.py)
    work: WorkLeases  # the only path from a worker to the streams (services/coordinator/work_leases.py)
    bootstrap: ClusterBootstrap | None = None  # GET /v1/cluster/bootstrap; None: not offered (no public key)


def get_coordinator(request: Request) -> Coordinator:
    return request.app.state.coordinator


CoordinatorDep = Annotated[Coordinator, Depends(get_coordinator)]


def get_registry(coordinator: CoordinatorDep) -> WorkerRegistry:
    return coordinator.registry


RegistryDep = Annotated[WorkerRegistry, Depends(get_registry)]


def get_control(request: Request) -> ControlPlane:
    return request.app.state.control


ControlDep = Annotated[ControlPlane, Depends(get_control)]


def get_probes(request: Request) -> InboundProbes:
    return request.app.state.reachability


ProbesDep = Annotated[InboundProbes, Depends(get_probes)]


def get_work_leases(coordinator: CoordinatorDep) -> WorkLeases:
    return coordinator.work


WorkLeasesDep = Annotated[WorkLeases, Depends(get_work_leases)]

_bearer = HTTPBearer(auto_error=False, description="a worker token from POST /v1/workers, or the admin token")


def get_caller(
    coordinator: CoordinatorDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Caller:
    if credentials is None:
        raise unauthorized("missing header 'Authorization: Bearer <token>'")
    try:
        return authenticate(credentials.credentials, coordinator.registry, coordinator.admin_token_sha256)
    except InvalidTokenError as exc:
        raise unauthorized(str(exc)) from exc


CallerDep = Annotated[Caller, Depends(get_caller)]


def get_worker_caller(caller: CallerDep) -> WorkerCaller:
    if not isinstance(caller, WorkerCaller):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="only a worker's own token can do this")
    return caller


WorkerCallerDep = Annotated[WorkerCaller, Depends(get_worker_caller)]


def get_admin_caller(caller: CallerDep) -> AdminCaller:
    if not isinstance(caller, AdminCaller):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="only the admin token can do this")
    return caller


AdminCallerDep = Annotated[AdminCaller, Depends(get_admin_caller)]


def get_bearer_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str | None:
    return None if credentials is None else credentials.credentials


BearerTokenDep = Annotated[str | None, Depends(get_bearer_token)]
JoinTokenDep = Annotated[
    str | None,
    Header(alias=JOIN_TOKEN_HEADER, max_length=256, description="the cluster's join token (registration)"),
]


def unauthorized(reason: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=reason, headers={"WWW-Authenticate": "Bearer"})


WorkerIdPath = Annotated[str, Path(min_length=1, max_length=64, description="id from POST /v1/workers")]
