"""Join credentials made outside the coordinator and provisioned at its start (RL_OPERATOR_TOKENS: what compose and
the Helm chart give it; services/coordinator/operators.py `provision`), against a real redis-server: the token
becomes an issued credential once, the same token again changes nothing (a revoked one stays revoked), and an id
that exists with another secret is refused, never overwritten. Then a real `python -m services.coordinator` with
RL_OPERATOR_TOKENS and no RL_JOIN_TOKEN: only those credentials (and issued ones) register, a restart keeps them,
and a conflicting token stops the start without printing a secret."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from cluster.ports import free_port
from cluster.processes import start_service
from cluster.redis_server import RedisServer
from services.coordinator.operators import OperatorCredentials
from shared.api import JOIN_TOKEN_HEADER, OPERATORS_PATH, OperatorInfo, OperatorState, WorkerInfo
from shared.keys import RunKeys
from tests.coordinator_rest import ADMIN_TOKEN, bearer, issue_credential
from tests.integration.test_cluster_bootstrap import healthy
from tests.polling import wait_for

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]

OPERATOR_ID = "op-0123456789ab"
TOKEN = OPERATOR_ID + ".compose-workers-xyzzy-0123456789"
OTHER_TOKEN = "op-ba9876543210.helm-workers-xyzzy-0123456789"


def stored(client: redis.Redis, keys: RunKeys) -> dict[bytes, bytes]:
    return client.hgetall(keys.operator(OPERATOR_ID))


def test_a_provisioned_token_becomes_a_credential_once(redis_client: redis.Redis, keys: RunKeys) -> None:
    credentials = OperatorCredentials(redis_client, keys, clock=lambda: 1000.0)
    assert credentials.provision(TOKEN, "compose workers") is True
    operator = credentials.identify(TOKEN)
    assert operator is not None
    assert (operator.operator_id, operator.name, operator.state) == (
        OPERATOR_ID,
        "compose workers",
        OperatorState.ACTIVE,
    )
    record = stored(redis_client, keys)
    assert not any(b"xyzzy" in value for value in record.values())  # only its sha256 is kept

    restarted = OperatorCredentials(redis_client, keys, clock=lambda: 2000.0)  # a coordinator starting again
    assert restarted.provision(TOKEN, "another name") is False
    assert stored(redis_client, keys) == record
    assert restarted.ids() == [OPERATOR_ID]


def test_a_revoked_provisioned_credential_stays_revoked(redis_client: redis.Redis, keys: RunKeys) -> None:
    credentials = OperatorCredentials(redis_client, keys)
    credentials.provision(TOKEN, "compose workers")
    credentials.revoke(OPERATOR_ID)
    assert credentials.provision(TOKEN, "compose workers") is False
    assert credentials.get(OPERATOR_ID).state == OperatorState.REVOKED


def test_an_id_that_exists_with_another_secret_is_refused_and_left_as_it_was(
    redis_client: redis.Redis, keys: RunKeys
) -> None:
    credentials = OperatorCredentials(redis_client, keys)
    credentials.provision(TOKEN, "compose workers")
    record = stored(redis_client, keys)
    forged = OPERATOR_ID + ".someone-elses-secret-0123456789"
    with pytest.raises(ValueError, match=f"{OPERATOR_ID} exists with another secret"):
        credentials.provision(forged, "forged")
    assert stored(redis_client, keys) == record and credentials.identify(forged) is None

    issued, _ = credentials.issue("alice")  # nor is an id the admin issued taken over
    with pytest.raises(ValueError, match="another secret"):
        credentials.provision(issued.operator_id + ".someone-elses-secret-0123456789", "forged")
    assert credentials.get(issued.operator_id).name == "alice"


@pytest.mark.parametrize(
    "malformed",
    [
        OPERATOR_ID + ".too-short",  # a secret of 16+ characters
        "op-0123456789AB.compose-workers-xyzzy-0123456789",  # an id as `issue` makes them: lowercase hex
        "op-0123456789a.compose-workers-xyzzy-0123456789",  # 12 hex digits
        "w-0123456789ab.compose-workers-xyzzy-0123456789",  # a worker's token
        OPERATOR_ID + ".compose workers xyzzy 0123456789",  # URL-safe characters only
        "compose-workers-xyzzy-0123456789",  # a shared join token
    ],
)
def test_a_malformed_token_is_refused_and_writes_nothing(
    malformed: str, redis_client: redis.Redis, keys: RunKeys
) -> None:
    with pytest.raises(ValueError, match="op-<12 hex>"):
        OperatorCredentials(redis_client, keys).provision(malformed, "malformed")
    assert list(redis_client.scan_iter(match=keys.prefix + "*")) == []


@contextlib.contextmanager
def coordinator_process(
    redis_server: RedisServer, keys: RunKeys, tmp_path: Path, operator_tokens: str
) -> Iterator[str]:
    """`python -m services.coordinator` with RL_OPERATOR_TOKENS and no RL_JOIN_TOKEN (as compose and Helm start it)."""
    port = free_port()
    env = {
        "RL_ADMIN_TOKEN": ADMIN_TOKEN,
        "RL_OPERATOR_TOKENS": operator_tokens,
        "RL_REDIS_URL": redis_server.url,
        "RL_RUN_CONFIG": str(REPO_ROOT / "configs" / "demo.toml"),
        "RL_RUN_ID": keys.run_id,
        "RL_COORDINATOR_PORT": str(port),
    }
    process = start_service("coordinator", "services.coordinator", env, tmp_path / "logs", REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: healthy(url, process), "the coordinator serves /healthz", timeout_s=60)
        yield url
    finally:
        process.popen.terminate()
        process.popen.wait(timeout=30)


def join(url: str, join_token: str | None, name: str = "w") -> httpx.Response:
    headers = {} if join_token is None else {JOIN_TOKEN_HEADER: join_token}
    return httpx.post(f"{url}/v1/workers", json={"name": name}, headers=headers)


def operator_of(url: str, response: httpx.Response) -> str:
    assert response.status_code == 201, response.text
    worker_id = response.json()["worker_id"]
    return WorkerInfo.model_validate(httpx.get(f"{url}/v1/workers/{worker_id}").json()).operator_id


def test_a_coordinator_with_operator_tokens_and_no_shared_token_registers_only_credentials(
    redis_server: RedisServer, keys: RunKeys, tmp_path: Path
) -> None:
    with coordinator_process(redis_server, keys, tmp_path, f"{TOKEN}, {OTHER_TOKEN}") as url:
        assert operator_of(url, join(url, TOKEN, "compose-0")) == OPERATOR_ID
        assert operator_of(url, join(url, OTHER_TOKEN, "helm-0")) == OTHER_TOKEN.partition(".")[0]
        with httpx.Client(base_url=url) as api:
            issued = issue_credential(api, "alice")  # an admin's credentials register as ever
        assert operator_of(url, join(url, issued, "alice-0")) == issued.partition(".")[0]
        assert join(url, None).status_code == 401  # no shared token to fall back on: nobody else registers
        assert join(url, "compose-workers-xyzzy-0123456789").status_code == 401
        assert join(url, ADMIN_TOKEN).status_code == 401
        listed = httpx.get(f"{url}{OPERATORS_PATH}", headers=bearer(ADMIN_TOKEN)).json()
        names = {OperatorInfo.model_validate(o).operator_id: OperatorInfo.model_validate(o).name for o in listed}
        assert names[OPERATOR_ID] == "RL_OPERATOR_TOKENS[0]" and names[OTHER_TOKEN.partition(".")[0]] == (
            "RL_OPERATOR_TOKENS[1]"
        )
    client = redis.Redis.from_url(redis_server.url)
    record = client.hgetall(keys.operator(OPERATOR_ID))

    with coordinator_process(redis_server, keys, tmp_path, TOKEN) as url:  # restarted: the same credential
        assert operator_of(url, join(url, TOKEN, "compose-1")) == OPERATOR_ID
    assert client.hgetall(keys.operator(OPERATOR_ID)) == record


def test_a_token_whose_id_exists_with_another_secret_stops_the_start(
    redis_server: RedisServer, keys: RunKeys, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    OperatorCredentials(client, keys).provision(TOKEN, "compose workers")
    forged = OPERATOR_ID + ".someone-elses-secret-0123456789"
    with pytest.raises(AssertionError, match="the coordinator exited") as exited:
        with coordinator_process(redis_server, keys, tmp_path, forged):
            pass
    assert f"{OPERATOR_ID} exists with another secret" in str(exited.value)
    assert "someone-elses-secret" not in str(exited.value)
    assert OperatorCredentials(client, keys).identify(TOKEN) is not None
