"""The coordinator's FastAPI app: routers (routers/), the heartbeat fast path, the lease sweeper and the control
loop, error mapping. All run state lives in Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import redis
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from services.coordinator.auth import token_sha256
from services.coordinator.body_limit import BodyLimit
from services.coordinator.control import ControlPlane
from services.coordinator.deps import Coordinator
from services.coordinator.errors import install_error_handlers
from services.coordinator.heartbeat_path import HeartbeatFastPath
from services.coordinator.prometheus import install_metrics
from services.coordinator.redis_access import RedisAccess
from services.coordinator.registration_limit import RegistrationLimit
from services.coordinator.routers import broadcast, cluster, control, operators, status, trust, weights, work, workers
from services.coordinator.work_leases import WorkLeases
from services.coordinator.worker_registry import WorkerRegistry
from shared.api import ClusterBootstrap
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.work_api import MAX_SUBMISSION_BYTES, ROLLOUTS_PATH

log = logging.getLogger(__name__)

# Expiry is also applied on every read; the sweeper makes dead workers visible without readers. It
# runs a few times per lease so a worker is marked dead well within one lease of its expiry.
MAX_SWEEP_INTERVAL_S = 1.0


class CoordinatorAPI(FastAPI):
    """FastAPI behind a body limit (services/coordinator/body_limit.py: 64 KiB, MAX_SUBMISSION_BYTES for
    the work API's rollouts), with the heartbeat fast path in front of everything else
    (services/coordinator/heartbeat_path.py): a worker's own heartbeat skips FastAPI's and Starlette's
    middleware layers, ~10% of its CPU."""

    heartbeat_fast_path: HeartbeatFastPath | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._limited = BodyLimit(self._route)
        self._limited_submissions = BodyLimit(self._route, max_bytes=MAX_SUBMISSION_BYTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == ROLLOUTS_PATH:
            await self._limited_submissions(scope, receive, send)
        else:
            await self._limited(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.heartbeat_fast_path is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
        else:
            await self.heartbeat_fast_path(scope, receive, send)  # anything not its own goes to serve_with_fastapi

    async def serve_with_fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


def create_app(
    run: RunConfig,
    redis_client: redis.Redis,
    admin_token: str,
    join_token: str | None = None,
    *,
    access: RedisAccess | None = None,
    bootstrap: ClusterBootstrap | None = None,
) -> FastAPI:
    """`redis_client` must be a bytes-mode client (`shared.bus.connect`). `join_token`: what a worker
    must send to register (header X-RL-Join-Token); None opens registration to anyone (dev and tests
    only: CoordinatorSettings requires RL_JOIN_TOKEN unless RL_OPEN_REGISTRATION is set). `access`: the
    workers' rollout-signing keys (services/coordinator/redis_access.py; default retention).
    `bootstrap`: what GET /v1/cluster/bootstrap hands a joining worker (None: 404 there)."""
    if not admin_token:
        raise ValueError("admin_token must not be empty")
    if join_token is not None and not join_token:
        raise ValueError("join_token must not be empty (None opens registration)")
    keys = RunKeys(run.run_id)
    access = access or RedisAccess(redis_client, keys)
    coordinator = Coordinator(
        run=run,
        keys=keys,
        redis=redis_client,
        registry=WorkerRegistry(redis_client, keys, lease_s=run.coordinator.lease_s),
        bus=StreamBus(redis_client, keys, service="coordinator"),
        admin_token_sha256=token_sha256(admin_token),
        join_token_sha256=None if join_token is None else token_sha256(join_token),
        registration_limit=RegistrationLimit(run.coordinator.registrations_per_s, run.coordinator.registration_burst),
        access=access,
        work=WorkLeases(redis_client, keys, lease_ms=run.rollout.claim_idle_ms, config=run.work),
        bootstrap=bootstrap,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sweep_interval_s = min(MAX_SWEEP_INTERVAL_S, run.coordinator.lease_s / 4)
        sweeper = asyncio.create_task(sweep_leases(coordinator.registry, sweep_interval_s), name="lease-sweeper")
        planner = asyncio.create_task(control_plane.run_forever(), name="control-loop")  # activation, ledger, history
        yield
        for task in (sweeper, planner):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if isinstance(app, CoordinatorAPI) and app.heartbeat_fast_path is not None:
            await app.heartbeat_fast_path.close()

    app = CoordinatorAPI(
        title="relay-rl coordinator",
        summary="Worker membership and leases, the staleness gate, and run status (control plane).",
        version="1",
        lifespan=lifespan,
        # metrics are ours (/metrics); FastAPI's OpenTelemetry hooks cost every heartbeat ~5% of its CPU
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.coordinator = coordinator
    control_plane = app.state.control = ControlPlane(coordinator)
    routers = (
        workers.router,
        work.router,
        cluster.router,
        trust.router,
        status.router,
        broadcast.router,
        control.router,
    )
    for router in routers:
        app.include_router(router)
    app.include_router(weights.router)  # its lifespan runs the announcement watcher (weights_feed.py)
    app.include_router(operators.router)  # join credentials: services/coordinator/operators.py
    install_metrics(app, control_plane)
    app.heartbeat_fast_path = HeartbeatFastPath(app.serve_with_fastapi, sync_client=redis_client, state=app.state)
    install_error_handlers(app)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, bool]:
        """Liveness for compose healthchecks: the process serves HTTP."""
        return {"ok": True}

    return app


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
