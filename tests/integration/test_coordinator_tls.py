"""TLS wherever a credential travels (docs/threat_model.md#tls): the real coordinator app over https under uvicorn
with a run's own CA (cluster/tls.py), and the worker's own clients (services/rollout/), all built with the one
verify of shared/tls.py. Real redis, real uvicorn, real sockets; no mocks.

    the run CA        registration, heartbeats, leases, the weights long poll and leaving work
    another CA, a     the connection fails in its TLS handshake: the coordinator never sees a request, so the
    wrong pin         join token was never sent (the worker's membership and `relay-rl worker` alike)
    a capture         every byte between a worker and the coordinator (tests/recording_proxy.py): no token in
                      it with TLS; each token in it without (the control)
    plain http        to a host that is not loopback: refused in one line before any connection, unless
                      --insecure
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.secrets import outbound_address
from cluster.tls import TlsFiles, make_run_certificates
from services.rollout.announcement_client import HttpAnnouncements
from services.rollout.coordinator_client import CoordinatorClient, CoordinatorUntrustedError
from services.rollout.membership import Membership
from services.rollout.work_client import WorkClient
from shared.api import (
    BOOTSTRAP_PATH,
    JOIN_TOKEN_HEADER,
    HeartbeatRequest,
    RegisterWorkerRequest,
    RegisterWorkerResponse,
)
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.tls import CoordinatorTrust, Verify, is_loopback_host, is_verification_failure
from tests.coordinator_rest import JOIN_TOKEN, ServedCoordinator, served_coordinator, worker_settings
from tests.recording_proxy import RecordingProxy

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL_HEADERS = {b"authorization", JOIN_TOKEN_HEADER.lower().encode()}


@dataclass
class SeenRequests:
    """Every request uvicorn handed the coordinator (an ASGI layer in front of all of the app's own, its heartbeat
    fast path included), and how many carried a credential: a connection that failed its handshake adds none."""

    paths: list[str] = field(default_factory=list)
    num_with_credentials: int = 0

    def front(self, app: FastAPI) -> ASGIApp:
        async def recorded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                self.paths.append(scope["path"])
                self.num_with_credentials += any(name in CREDENTIAL_HEADERS for name, _ in scope["headers"])
            await app(scope, receive, send)

        return recorded


@pytest.fixture
def run(keys: RunKeys) -> RunConfig:
    return RunConfig(run_id=keys.run_id)


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    """This run's CA and the coordinator's certificate for 127.0.0.1 and localhost."""
    return make_run_certificates(tmp_path / "tls", ["127.0.0.1", "localhost"])


@pytest.fixture
def seen() -> SeenRequests:
    return SeenRequests()


@pytest.fixture
def coordinator(run: RunConfig, redis_client: redis.Redis, tls: TlsFiles, seen: SeenRequests) -> Iterator[str]:
    """The coordinator over https with this run's certificate; its URL."""
    with served_coordinator(run, redis_client, tls=tls, front=seen.front) as served:
        yield served.url


def work_as_a_worker(url: str, verify: Verify, run_id: str) -> RegisterWorkerResponse:
    """What a rollout worker says to the coordinator, with its own clients: register (the join token), heartbeat,
    lease, long-poll the weights (its bearer token), leave."""
    membership = Membership(
        CoordinatorClient(url, join_token=JOIN_TOKEN, verify=verify),
        RegisterWorkerRequest(name="tls-worker"),
        HeartbeatRequest,
        threading.Event(),
    )
    registration = membership.register()
    token = registration.token
    membership.client.heartbeat(registration.worker_id, token, HeartbeatRequest())
    work = WorkClient(url, lambda: token, run_id, verify=verify)
    announcements = HttpAnnouncements(url, lambda: token, verify=verify)
    try:
        assert work.lease(1).tasks == []  # no task queued: an empty answer, over an authenticated call
        assert announcements.latest() is None
    finally:
        work.close()
        announcements.close()
    membership.leave()
    membership.client.close()
    return registration


def test_a_worker_trusting_the_run_ca_registers_heartbeats_leases_and_polls_over_https(
    coordinator: str, tls: TlsFiles, run: RunConfig, seen: SeenRequests, tmp_path: Path
) -> None:
    settings = worker_settings(coordinator, tmp_path, "tls-worker", coordinator_ca_file=tls.ca_file)
    assert coordinator.startswith("https://")
    registration = work_as_a_worker(coordinator, settings.coordinator_verify(), run.run_id)
    assert registration.run_id == run.run_id
    assert seen.paths == [
        "/v1/workers",
        f"/v1/workers/{registration.worker_id}/heartbeat",
        "/v1/work/lease",
        "/v1/weights/latest",
        f"/v1/workers/{registration.worker_id}",
    ]
    assert seen.num_with_credentials == 5


def test_a_certificate_of_another_ca_fails_the_handshake_before_the_join_token_is_sent(
    coordinator: str, seen: SeenRequests, tmp_path: Path
) -> None:
    other_run = make_run_certificates(tmp_path / "other-run", ["127.0.0.1"])
    membership = Membership(
        CoordinatorClient(coordinator, join_token=JOIN_TOKEN, verify=CoordinatorTrust(other_run.ca_file).verify()),
        RegisterWorkerRequest(name="w"),
        HeartbeatRequest,
        threading.Event(),
    )
    with pytest.raises(CoordinatorUntrustedError, match="certificate failed verification.*CERTIFICATE_VERIFY_FAILED"):
        membership.register()  # not retried: a misconfiguration or an impostor
    assert seen.paths == []  # no request reached the server: the join token never left the worker

    joined = relay_rl_worker(
        "--coordinator", coordinator, "--ca-file", str(other_run.ca_file), f"--token={JOIN_TOKEN}", tmp_path=tmp_path
    )
    assert joined.returncode == 5, joined.stderr
    assert "failed TLS verification (nothing was sent)" in joined.stderr and "Traceback" not in joined.stderr
    assert seen.paths == []


def test_a_pinned_certificate_is_trusted_alone_and_a_wrong_pin_fails_before_the_join_token_is_sent(
    coordinator: str, tls: TlsFiles, run: RunConfig, seen: SeenRequests, tmp_path: Path
) -> None:
    pinned = worker_settings(coordinator, tmp_path, "w", coordinator_cert_sha256=tls.cert_sha256)  # no CA at all
    work_as_a_worker(coordinator, pinned.coordinator_verify(), run.run_id)
    num_seen = len(seen.paths)

    another = make_run_certificates(tmp_path / "another", ["127.0.0.1"]).cert_sha256
    client = CoordinatorClient(
        coordinator, join_token=JOIN_TOKEN, verify=CoordinatorTrust(cert_sha256=another).verify_for(coordinator)
    )
    with pytest.raises(CoordinatorUntrustedError, match=f"has SHA-256 {tls.cert_sha256}, not the pinned {another}"):
        client.register(RegisterWorkerRequest(name="w"))
    assert len(seen.paths) == num_seen  # the handshake failed: no request, no join token

    async def bootstrap_with(pin: str) -> int:  # an asyncio client (a memory-BIO handshake) pins the same way
        async with httpx.AsyncClient(verify=CoordinatorTrust(cert_sha256=pin).verify()) as http:
            response = await http.get(coordinator + BOOTSTRAP_PATH, headers={JOIN_TOKEN_HEADER: JOIN_TOKEN})
            return response.status_code

    assert asyncio.run(bootstrap_with(tls.cert_sha256)) == 404  # reached it: this coordinator has no bootstrap
    with pytest.raises(httpx.ConnectError) as refused:
        asyncio.run(bootstrap_with(another))
    assert is_verification_failure(refused.value)
    assert seen.paths[num_seen:] == [BOOTSTRAP_PATH]  # the pinned one only


def test_a_capture_of_the_traffic_holds_no_token_with_tls_and_every_token_without(
    run: RunConfig, redis_client: redis.Redis, tls: TlsFiles
) -> None:
    """Every byte between a worker and the coordinator, both ways, through a recording forwarder (what anyone on
    the path sees). With TLS: no token, no rollout key, not even the paths. Without (the control): all of them."""
    for use_tls in (True, False):
        with (
            served_coordinator(run, redis_client, tls=tls if use_tls else None) as served,
            recording_proxy_to(served) as proxy,
        ):
            url = f"{'https' if use_tls else 'http'}://127.0.0.1:{proxy.port}"
            registration = work_as_a_worker(url, CoordinatorTrust(tls.ca_file).verify_for(url), run.run_id)
        captured = proxy.captured()
        secrets = {
            "the join token": JOIN_TOKEN.encode(),
            "the worker's bearer token": registration.token.encode(),
            "its rollout key": registration.access.rollout_key_hex.encode(),
            "a request path": b"/v1/work/lease",
        }
        assert proxy.num_connections >= 1 and len(captured) > 2_000, len(captured)
        if use_tls:
            assert [what for what, secret in secrets.items() if secret in captured] == []
        else:  # the control: the same calls in clear text show every one of them
            assert [what for what, secret in secrets.items() if secret not in captured] == []


def test_plain_http_to_a_host_that_is_not_loopback_is_refused_before_any_connection_unless_insecure(
    run: RunConfig, redis_client: redis.Redis, seen: SeenRequests, tmp_path: Path
) -> None:
    """A coordinator on this machine's own network address, over plain http: `relay-rl worker` and `python -m
    services.rollout` refuse it in one line and never connect; `--insecure` goes through."""
    address = outbound_address()
    if is_loopback_host(address) or not address[:1].isdigit():
        pytest.skip(f"this machine has no non-loopback address to serve on ({address})")
    with served_coordinator(run, redis_client, host=address, front=seen.front) as served:
        refused = relay_rl_worker("--coordinator", served.url, f"--token={JOIN_TOKEN}", tmp_path=tmp_path)
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith(f"relay-rl worker: refusing plain http:// to the coordinator at {address}")

        worker = subprocess.run(
            [sys.executable, "-m", "services.rollout"],
            cwd=REPO_ROOT,
            env=clean_env(
                RL_COORDINATOR_URL=served.url,
                RL_JOIN_TOKEN=JOIN_TOKEN,
                RL_WEIGHTS_PUBLIC_KEY="ab" * 32,
                RL_RUN_CONFIG=str(REPO_ROOT / "configs" / "demo.toml"),
                RL_RUN_DIR=str(tmp_path / "run"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode != 0
        assert worker.stderr.strip().splitlines()[-1].startswith("rollout: refusing plain http:// to the coordinator")
        assert seen.paths == []

        insecure = relay_rl_worker(
            "--coordinator", served.url, f"--token={JOIN_TOKEN}", "--insecure", tmp_path=tmp_path
        )
        assert insecure.returncode == 1 and "HTTP 404" in insecure.stderr, insecure.stderr  # it reached the bootstrap
        assert seen.paths == ["/v1/cluster/bootstrap"] and seen.num_with_credentials == 1


def clean_env(**variables: str) -> dict[str, str]:
    """This process's environment without any RL_* variable, plus `variables`."""
    return {name: value for name, value in os.environ.items() if not name.startswith("RL_")} | variables


def relay_rl_worker(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`relay-rl worker ARGS` with no RL_* variable and no local cluster to fall back on."""
    command = [sys.executable, "-m", "cluster.cli", "worker", "--run-dir", str(tmp_path / "no-local-cluster")]
    command += ["--work-dir", str(tmp_path / "work"), *args]
    return subprocess.run(command, cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True, timeout=60)


def recording_proxy_to(served: ServedCoordinator) -> RecordingProxy:
    """A recording forwarder on a free port of loopback to the coordinator's."""
    port = urlsplit(served.url).port
    assert port is not None
    return RecordingProxy(("127.0.0.1", port))
