"""A worker on the internet: the coordinator hands out a rediss:// URL (TLS, with the CA file as a query
parameter) and the worker's own connection code (services/rollout/redis_access.py) reaches a real
redis-server over TLS as its issued ACL user. Skipped where redis-server was built without TLS or there
is no openssl to make a certificate."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from cluster.redis_acl import OPERATOR, RedisUsers
from cluster.redis_server import find_server_binary, free_port
from services.coordinator.redis_access import RedisAccess
from services.rollout.redis_access import connect_as_worker
from shared.bus import connect
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.streams import ROLLOUTS, SCORED
from tests.coordinator_rest import register, served_coordinator
from tests.polling import wait_for

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class TlsRedis:
    url: str  # rediss://..., no credentials, the CA file as ssl_ca_certs
    users: RedisUsers
    keys: RunKeys


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), and its key."""
    cert, key = directory / "redis.crt", directory / "redis.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = make_certificate(tmp_path)
    keys = RunKeys(f"test-{uuid.uuid4().hex[:10]}")
    users = RedisUsers(keys.run_id)
    acl_file = users.write_acl_file(tmp_path / "users.acl")
    port = free_port()
    args = [find_server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"]
    args += ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)]
    args += ["--tls-auth-clients", "no", "--aclfile", str(acl_file), "--save", "", "--dir", str(tmp_path)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={quote(str(cert), safe='')}"
        operator = redis.Redis.from_url(url, username=OPERATOR, password=users.passwords[OPERATOR])

        def serving() -> bool:
            if process.poll() is not None:
                output = process.stdout.read().decode() if process.stdout else ""
                if "TLS" in output and ("not" in output or "support" in output):
                    pytest.skip(f"redis-server without TLS: {output[-300:]}")
                raise AssertionError(f"redis-server exited: {output[-2000:]}")
            try:
                return bool(operator.ping())
            except redis.ConnectionError:
                return False

        wait_for(serving, "redis-server to serve TLS")
        yield TlsRedis(url, users, keys)
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_worker_reaches_redis_over_tls_as_its_issued_user(tls_redis: TlsRedis) -> None:
    coordinator_client = connect(tls_redis.users.url_for("coordinator", tls_redis.url))
    access = RedisAccess(coordinator_client, tls_redis.keys, acl=True, worker_redis_url=tls_redis.url)
    with served_coordinator(RunConfig(run_id=tls_redis.keys.run_id), coordinator_client, access=access) as served:
        registration = register(served.client, "remote")
    assert registration.access.redis_url == tls_redis.url
    client = connect_as_worker(registration.access, lambda: registration.access, "redis://unused:1/0")
    assert client is not None
    assert client.connection_pool.connection_class is redis.SSLConnection
    client.xadd(tls_redis.keys.name_of(ROLLOUTS), {b"data": b"x"})
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.xadd(tls_redis.keys.name_of(SCORED), {b"data": b"x"})
    client.close()
    coordinator_client.close()
