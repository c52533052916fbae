"""The tests' side of the coordinator's REST API: the real app served under uvicorn in a thread (with
hand-driven clocks when a test needs them), the admin token those apps accept, and registering a worker.
The `serve_coordinator` fixture (tests/integration/conftest.py) is the usual way in."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from fastapi import FastAPI
from starlette.types import ASGIApp

from cluster.tls import TlsFiles
from services.coordinator.announcements import Announcements
from services.coordinator.app import create_app
from services.coordinator.redis_access import RedisAccess
from services.coordinator.uvicorn_server import CoordinatorServer
from services.rollout.settings import RolloutSettings
from shared import worker_rewards
from shared.api import JOIN_TOKEN_HEADER, OPERATORS_PATH, ClusterBootstrap, IssuedOperator, RegisterWorkerResponse
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.streams import WEIGHTS
from tests.uvicorn_thread import serve
from tests.weights_keys import PUBLIC_KEY_HEX

ADMIN_TOKEN = "test-admin-token-0123456789"
JOIN_TOKEN = "test-join-token-0123456789"
JOIN_HEADERS = {JOIN_TOKEN_HEADER: JOIN_TOKEN}  # what a worker sends to register

Clock = Callable[[], float]  # unix seconds


def worker_settings(
    coordinator_url: str, model_dir: Path, worker_name: str, worker_poll_s: float = 0.05, **fields: Any
) -> RolloutSettings:
    """An in-process worker's settings: the tests' public key and join token, a fast poll, and `fields`
    (no Redis: a worker reaches the run only through the coordinator)."""
    return RolloutSettings(
        weights_public_key=PUBLIC_KEY_HEX,
        join_token=JOIN_TOKEN,
        coordinator_url=coordinator_url,
        model_dir=model_dir,
        worker_name=worker_name,
        worker_poll_s=worker_poll_s,
        **fields,
    )


@dataclass(frozen=True)
class ServedCoordinator:
    url: str
    client: httpx.Client  # on `url`, sending the join token (JOIN_HEADERS)
    app: FastAPI  # app.state.control: the control loop; app.state.coordinator.registry: the leases


ServeCoordinator = Callable[..., ServedCoordinator]  # the `serve_coordinator` fixture: (run, **clocks) -> ...


@contextlib.contextmanager
def served_coordinator(
    run: RunConfig,
    redis_client: redis.Redis,
    *,
    lease_clock: Clock | None = None,
    control_clock: Clock | None = None,
    port: int | None = None,
    access: RedisAccess | None = None,
    bootstrap: ClusterBootstrap | None = None,
    tls: TlsFiles | None = None,
    host: str = "127.0.0.1",
    front: Callable[[FastAPI], ASGIApp] | None = None,
) -> Iterator[ServedCoordinator]:
    """The real coordinator app for `run` under uvicorn until the block ends. `lease_clock` replaces the
    wall clock of the leases (registration, heartbeats, expiry, the sweeper), `control_clock` that of the
    control loop (billing, dwell); both are set before the app serves anything or runs a pass. `access`:
    the workers' rollout keys (default retention). `bootstrap`: what GET /v1/cluster/bootstrap answers
    (default: 404). `tls`: served over https with a run's certificate (the client trusts its CA); `host`: the
    address it binds (default loopback); `front`: an ASGI layer served in front of the app (a test's recorder). The
    app requires JOIN_TOKEN to register; the client sends it with every request (JOIN_HEADERS)."""
    app = create_app(run, redis_client, ADMIN_TOKEN, JOIN_TOKEN, access=access, bootstrap=bootstrap)
    if lease_clock is not None:
        app.state.coordinator.registry.clock = lease_clock
    if control_clock is not None:
        app.state.control.clock = control_clock
    verify: ssl.SSLContext | bool = True if tls is None else ssl.create_default_context(cafile=str(tls.ca_file))
    with (
        serve(
            app if front is None else front(app),
            port,
            tls=tls,
            host=host,
            server_class=lambda config: CoordinatorServer(config, app),
        ) as url,
        httpx.Client(base_url=url, timeout=10, headers=JOIN_HEADERS, verify=verify) as client,
    ):
        yield ServedCoordinator(url=url, client=client, app=app)


def announce(
    redis_client: redis.Redis,
    run_id: str,
    policy_version: int,
    published_at_s: float,
    publish_started_at_s: float = 0.0,
    *,
    ingest: bool = True,
) -> None:
    """What the learner does when a version is out (a WeightsPublished on the WEIGHTS stream), and the
    coordinator reading it at once (its control pass would within a second; `ingest=False`: not yet):
    only then do swap reports of that version count (services/coordinator/announcements.py).
    `publish_started_at_s` 0.0: a learner that does not say when it started publishing."""
    keys = RunKeys(run_id)
    announcement = WeightsPublished(
        run_id=run_id,
        policy_version=policy_version,
        manifest_url=f"http://learner:8100/v1/weights/{policy_version}/manifest",
        manifest_sha256="0" * 64,
        total_size_bytes=10,
        num_chunks=1,
        published_at_s=published_at_s,
        publish_started_at_s=publish_started_at_s,
    )
    StreamBus(redis_client, keys, service="test-learner").publish(WEIGHTS, announcement)
    if ingest:
        Announcements(redis_client, keys).ingest()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def register(
    api: httpx.Client, name: str = "w", *, join_token: str | None = None, **fields: object
) -> RegisterWorkerResponse:
    """Register a worker over REST (fields of RegisterWorkerRequest), with the client's join token (the shared
    one) or `join_token` (an issued credential); fails the test unless it is 201."""
    headers = {} if join_token is None else {JOIN_TOKEN_HEADER: join_token}
    response = api.post("/v1/workers", json={"name": name, **fields}, headers=headers)
    assert response.status_code == 201, response.text
    return RegisterWorkerResponse.model_validate(response.json())


def issue_credential(api: httpx.Client, name: str, **budget: object) -> str:
    """A join credential issued by the admin (with its own budget fields, if any); returns its join token."""
    body: dict[str, object] = {"name": name} | ({"budget": budget} if budget else {})
    response = api.post(OPERATORS_PATH, json=body, headers=bearer(ADMIN_TOKEN))
    assert response.status_code == 201, response.text
    return IssuedOperator.model_validate(response.json()).join_token


def score_groups(client: redis.Redis, keys: RunKeys, worker_id: str, num_groups: int, *, rejected: int = 0) -> None:
    """What the reward service records when it scores `num_groups` groups of the worker, and dead-letters
    `rejected` others (shared/worker_rewards.py)."""
    if num_groups:
        client.hincrbyfloat(keys.worker_rewards(worker_id), worker_rewards.NUM_GROUPS, num_groups)
    if rejected:
        client.hincrby(keys.worker_rewards(worker_id), worker_rewards.NUM_REJECTED, rejected)
