"""The coordinator's FastAPI app: routers (routers/), the heartbeat fast path, the lease sweeper, the control
loop and the workers' reachability probes, error mapping. All run state lives in Redis."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import redis
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from services.coordinator.auth import TOKEN_SEPARATOR, token_sha256
from services.coordinator.body_limit import BodyLimit
from services.coordinator.control import ControlPlane
from services.coordinator.credential_budget import Budgets
from services.coordinator.deps import Coordinator
from services.coordinator.errors import install_error_handlers
from services.coordinator.heartbeat_path import HeartbeatFastPath
from services.coordinator.lease_pacing import LeasePacing
from services.coordinator.prometheus import install_metrics
from services.coordinator.reachability import InboundProbes
from services.coordinator.redis_access import RedisAccess
from services.coordinator.registration_limit import RegistrationLimits, retry_after_header
from services.coordinator.relay_view import RELAY_STATES
from services.coordinator.routers import broadcast, cluster, control, operators, status, trust, weights, work, workers
from services.coordinator.submission_penalty import SubmissionPenalties
from services.coordinator.work_leases import WorkLeases
from services.coordinator.worker_registry import WorkerRegistry
from shared.api import JOIN_TOKEN_HEADER, ClusterBootstrap, WorkerInfo
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.work_api import LEASE_PATH, ROLLOUTS_PATH, LeaseResponse, max_submission_bytes

log = logging.getLogger(__name__)

WORKERS_PATH = "/v1/workers"  # POST: registration (services/coordinator/routers/workers.py)
JOIN_TOKEN_HEADER_BYTES = JOIN_TOKEN_HEADER.lower().encode()  # ASGI header names are lower-case bytes

# Expiry is also applied on every read; the sweeper makes dead workers visible without readers. It
# runs a few times per lease so a worker is marked dead well within one lease of its expiry.
MAX_SWEEP_INTERVAL_S = 1.0


class CoordinatorAPI(FastAPI):
    """FastAPI behind a body limit (services/coordinator/body_limit.py: 64 KiB; the work API's rollouts: the
    run's largest honest submission, 1 to 16 MiB, shared/work_api.py max_submission_bytes), with the heartbeat
    fast path in front of everything else (services/coordinator/heartbeat_path.py): a worker's own heartbeat
    skips FastAPI's and Starlette's middleware layers, ~10% of its CPU."""

    heartbeat_fast_path: HeartbeatFastPath | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._limited = BodyLimit(self._route)

    @functools.cached_property
    def _limited_submissions(self) -> BodyLimit:
        # the run's limit: create_app sets the coordinator (and its run) before the app serves a request
        return BodyLimit(self._route, max_bytes=max_submission_bytes(self.state.coordinator.run))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == ROLLOUTS_PATH:
            await self._limited_submissions(scope, receive, send)
        else:
            await self._limited(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            await refused_early(self, scope, send)
            or await penalised(self, scope, send)
            or await answered_empty(self, scope, receive, send)
        ):
            return
        if self.heartbeat_fast_path is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
        else:
            await self.heartbeat_fast_path(scope, receive, send)  # anything not its own goes to serve_with_fastapi

    async def serve_with_fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


async def refused_early(app: FastAPI, scope: Scope, send: Send) -> bool:
    """A registration under a join token verified lately whose credential's bucket is empty: 429 here, before
    FastAPI reads anything (services/coordinator/registration_limit.py refuse_early). True when answered."""
    if scope["method"] != "POST" or scope["path"] != WORKERS_PATH:
        return False
    presented = next((value for name, value in scope["headers"] if name == JOIN_TOKEN_HEADER_BYTES), None)
    if presented is None:
        return False
    limits = app.state.coordinator.registration_limits
    wait_s = limits.refuse_early(token_sha256(presented.decode("latin-1")))
    if wait_s is None:
        return False
    detail = f"too many registrations with this join credential: retry in {wait_s:.2f}s"
    await answer_json(send, 429, {"detail": detail}, [(b"retry-after", retry_after_header(wait_s).encode())])
    return True


async def penalised(app: FastAPI, scope: Scope, send: Send) -> bool:
    """A submission of a worker still penalised for a garbage body: 429 here, its body unread and the connection
    closed (services/coordinator/submission_penalty.py). True when answered."""
    if scope["method"] != "POST" or scope["path"] != ROLLOUTS_PATH:
        return False
    worker_id = claimed_worker_id(scope)
    wait_s = app.state.coordinator.submission_penalties.wait_s(worker_id) if worker_id else None
    if wait_s is None:
        return False
    detail = f"a garbage submission was refused (422): no submission of yours is read for {wait_s:.2f}s more"
    await answer_json(send, 429, {"detail": detail}, [(b"retry-after", retry_after_header(wait_s).encode())])
    return True


async def answered_empty(app: FastAPI, scope: Scope, receive: Receive, send: Send) -> bool:
    """A lease call of a worker that holds all it may, asked again within its hold: an empty LeaseResponse here,
    without Redis (services/coordinator/lease_pacing.py); the connection kept. True when answered."""
    if scope["method"] != "POST" or scope["path"] != LEASE_PATH:
        return False
    worker_id = claimed_worker_id(scope)
    coordinator = app.state.coordinator
    if not worker_id or not coordinator.lease_pacing.answer_early(worker_id):
        return False
    while (await receive()).get("more_body", False):  # a lease request is a few bytes (BodyLimit bounds it)
        pass
    empty = LeaseResponse(lease_s=coordinator.work.lease_s, tasks=[]).model_dump(mode="json")
    await answer_json(send, 200, empty, [], keep_alive=True)
    return True


def claimed_worker_id(scope: Scope) -> str:
    """The worker id a request's bearer token claims, unverified ("" when it names none)."""
    authorization = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
    token = authorization.decode("latin-1").removeprefix("Bearer ").strip()
    worker_id, separator, _ = token.partition(TOKEN_SEPARATOR)
    return worker_id if separator else ""


async def answer_json(
    send: Send, status_code: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]], *, keep_alive: bool = False
) -> None:
    """A whole JSON response; the connection closed after it unless `keep_alive` (the request's body read)."""
    payload = json.dumps(body).encode()
    headers = [*headers, (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if not keep_alive:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status_code, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def create_app(
    run: RunConfig,
    redis_client: redis.Redis,
    admin_token: str,
    join_token: str | None = None,
    *,
    open_registration: bool | None = None,
    access: RedisAccess | None = None,
    bootstrap: ClusterBootstrap | None = None,
) -> FastAPI:
    """`redis_client` must be a bytes-mode client (`shared.bus.connect`). `join_token`: the cluster's shared
    token a worker may send to register (header X-RL-Join-Token; None: there is none, only issued credentials
    register). `open_registration`: anyone may register (dev and tests only: RL_OPEN_REGISTRATION); None: open
    when there is no shared token (tests). `access`: the
    workers' rollout-signing keys (services/coordinator/redis_access.py; default retention).
    `bootstrap`: what GET /v1/cluster/bootstrap hands a joining worker (None: 404 there).

    The app's parts, in order: its state (the Coordinator every endpoint asks for, the control loop, the
    reachability probes), the background tasks its lifespan runs, the routers, the middleware around them."""
    coordinator = build_coordinator(
        run,
        redis_client,
        admin_token,
        join_token,
        open_registration=open_registration,
        access=access,
        bootstrap=bootstrap,
    )
    control_plane = ControlPlane(coordinator)
    probes = InboundProbes(coordinator.registry, relay_workers_of(control_plane), enabled=run.broadcast.probe_inbound)
    app = CoordinatorAPI(
        title="relay-rl coordinator",
        summary="Worker membership and leases, the staleness gate, and run status (control plane).",
        version="1",
        lifespan=background_tasks(coordinator, control_plane, probes),
        # metrics are ours (/metrics); FastAPI's OpenTelemetry hooks cost every heartbeat ~5% of its CPU
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.coordinator = coordinator
    app.state.control = control_plane
    app.state.reachability = probes
    include_routers(app)
    install_middleware(app, control_plane, redis_client)
    return app


def build_coordinator(
    run: RunConfig,
    redis_client: redis.Redis,
    admin_token: str,
    join_token: str | None,
    *,
    open_registration: bool | None,
    access: RedisAccess | None,
    bootstrap: ClusterBootstrap | None,
) -> Coordinator:
    """The app's state: what every endpoint asks for (services/coordinator/deps.py), over `redis_client`."""
    if not admin_token:
        raise ValueError("admin_token must not be empty")
    if join_token is not None and not join_token:
        raise ValueError("join_token must not be empty (None: no shared token)")
    keys = RunKeys(run.run_id)
    return Coordinator(
        run=run,
        keys=keys,
        redis=redis_client,
        registry=WorkerRegistry(redis_client, keys, lease_s=run.coordinator.lease_s),
        bus=StreamBus(redis_client, keys, service="coordinator"),
        admin_token_sha256=token_sha256(admin_token),
        join_token_sha256=None if join_token is None else token_sha256(join_token),
        open_registration=join_token is None if open_registration is None else open_registration,
        registration_limits=RegistrationLimits(),
        budgets=Budgets(redis_client, keys, run.credentials),
        submission_penalties=SubmissionPenalties(),
        lease_pacing=LeasePacing(lease_s=run.rollout.claim_idle_ms / 1000),
        access=access or RedisAccess(redis_client, keys),
        work=WorkLeases(
            redis_client, keys, lease_ms=run.rollout.claim_idle_ms, config=run.work, credentials=run.credentials
        ),
        bootstrap=bootstrap,
    )


def relay_workers_of(control_plane: ControlPlane) -> Callable[[], list[WorkerInfo]]:
    """What the reachability probes probe: the relay plan's workers with a chunk server, as of the control loop's
    last pass."""

    def relay_workers() -> list[WorkerInfo]:
        snapshot = control_plane.snapshot
        return [] if snapshot is None else [w for w in snapshot.workers if w.state in RELAY_STATES and w.endpoint_url]

    return relay_workers


def background_tasks(
    coordinator: Coordinator, control_plane: ControlPlane, probes: InboundProbes
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the lease sweeper, the control loop and the reachability probes run while it serves;
    at its end they are cancelled and the heartbeat fast path is closed."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sweep_interval_s = min(MAX_SWEEP_INTERVAL_S, coordinator.run.coordinator.lease_s / 4)
        sweeper = asyncio.create_task(sweep_leases(coordinator.registry, sweep_interval_s), name="lease-sweeper")
        planner = asyncio.create_task(control_plane.run_forever(), name="control-loop")  # activation, ledger, history
        prober = asyncio.create_task(probes.run_forever(), name="reachability-probes")  # reachability.py
        yield
        for task in (sweeper, planner, prober):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if isinstance(app, CoordinatorAPI) and app.heartbeat_fast_path is not None:
            await app.heartbeat_fast_path.close()

    return lifespan


def include_routers(app: FastAPI) -> None:
    """The HTTP layer: one router per resource (routers/), and the app's own liveness check."""
    for router in (
        workers.router,
        work.router,
        cluster.router,
        trust.router,
        status.router,
        broadcast.router,
        control.router,
    ):
        app.include_router(router)
    app.include_router(weights.router)  # its lifespan runs the announcement watcher (weights_feed.py)
    app.include_router(operators.router)  # join credentials: services/coordinator/operators.py

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, bool]:
        """Liveness for compose healthchecks: the process serves HTTP."""
        return {"ok": True}


def install_middleware(app: CoordinatorAPI, control_plane: ControlPlane, redis_client: redis.Redis) -> None:
    """What surrounds the routers: the collector of GET /metrics, the heartbeat fast path in front of them, and
    the mapping of failures to HTTP statuses."""
    install_metrics(app, control_plane)
    app.heartbeat_fast_path = HeartbeatFastPath(app.serve_with_fastapi, sync_client=redis_client, state=app.state)
    install_error_handlers(app)


async def sweep_leases(registry: WorkerRegistry, interval_s: float) -> None:
    """Mark workers whose lease ran out as dead, every `interval_s`, until cancelled. (Their tasks need no
    sweeping: a task lease that runs out is reissued by the next lease call, services/coordinator/work_leases.py.)"""
    while True:
        try:
            expired = await asyncio.to_thread(registry.expire_due)
        except redis.RedisError as exc:  # Redis down or restarting: try again next tick
            log.warning("lease sweep failed: %s", exc)
        else:
            for worker_id in expired:
                log.info("worker %s is dead: lease expired", worker_id)
        await asyncio.sleep(interval_s)
