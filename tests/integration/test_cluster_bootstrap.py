"""GET /v1/cluster/bootstrap: a real `python -m services.coordinator` hands a worker holding the join token
the run file, run id, public key, Redis URL and model, and nobody else anything; and `relay-rl worker`
fails in one clear line, with its exit code, on a wrong token, a pinned key that differs, a coordinator
without a bootstrap and one that is not there. Real redis, real uvicorn."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from cluster.ports import free_port
from cluster.processes import ServiceProcess, start_service
from cluster.redis_server import RedisServer
from shared.api import BOOTSTRAP_PATH, JOIN_TOKEN_HEADER, ClusterBootstrap
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.signing import generate_key_pair
from tests.coordinator_rest import ADMIN_TOKEN, JOIN_TOKEN, served_coordinator
from tests.polling import wait_for
from tests.weights_keys import PUBLIC_KEY_HEX

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]

BASE_FILE = """run_id = "the-base"
[model]
init = "tiny-random"
max_position_embeddings = 32
"""
RUN_FILE = """extends = "base.toml"
run_id = "from-the-file"
[schedule]
staleness_bound = 3
"""


@pytest.fixture
def coordinator_process(redis_server: RedisServer, keys: RunKeys, tmp_path: Path) -> Iterator[str]:
    """`python -m services.coordinator` as cluster.local starts it (RL_RUN_ID overrides the file's run_id)."""
    (tmp_path / "base.toml").write_text(BASE_FILE)
    run_file = tmp_path / "run.toml"
    run_file.write_text(RUN_FILE)
    port = free_port()
    env = {
        "RL_ADMIN_TOKEN": ADMIN_TOKEN,
        "RL_JOIN_TOKEN": JOIN_TOKEN,
        "RL_REDIS_URL": redis_server.url,
        "RL_RUN_CONFIG": str(run_file),
        "RL_RUN_ID": keys.run_id,
        "RL_WEIGHTS_PUBLIC_KEY": PUBLIC_KEY_HEX,
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


def healthy(url: str, process: ServiceProcess) -> bool:
    if not process.alive():
        raise AssertionError(f"the coordinator exited:\n{process.log_tail()}")
    try:
        return httpx.get(url + "/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_bootstrap_needs_the_join_token_and_hands_out_the_run_and_key_but_no_redis(
    coordinator_process: str, redis_server: RedisServer, keys: RunKeys
) -> None:
    url = coordinator_process + BOOTSTRAP_PATH
    missing = httpx.get(url)
    assert missing.status_code == 401 and JOIN_TOKEN_HEADER in missing.json()["detail"]
    wrong = httpx.get(url, headers={JOIN_TOKEN_HEADER: "not-the-join-token-0123"})
    assert wrong.status_code == 401 and "wrong" in wrong.json()["detail"]
    admin = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})  # the admin token is no join token
    assert admin.status_code == 401

    answer = httpx.get(url, headers={JOIN_TOKEN_HEADER: JOIN_TOKEN})
    assert answer.status_code == 200, answer.text
    bootstrap = ClusterBootstrap.model_validate_json(answer.content)
    assert bootstrap.run_id == keys.run_id  # RL_RUN_ID, not the file's run_id
    # the run file resolved: one self-contained file, its base's sections in it, no `extends` left
    assert tomllib.loads(bootstrap.run_config_toml) == {
        "run_id": "from-the-file",
        "model": {"init": "tiny-random", "max_position_embeddings": 32},
        "schedule": {"staleness_bound": 3},
    }
    assert bootstrap.weights_public_key == PUBLIC_KEY_HEX
    assert "redis" not in answer.text.lower()  # workers need no Redis: the work API is their way in
    assert bootstrap.model.init == "tiny-random" and bootstrap.model.max_position_embeddings == 32


def relay_rl_worker(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`relay-rl worker ARGS` with no RL_* variable and no local cluster to fall back on."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("RL_")}
    command = [sys.executable, "-m", "cluster.cli", "worker", "--run-dir", str(tmp_path / "no-local-cluster")]
    command += ["--work-dir", str(tmp_path / "work"), *args]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def served_bootstrap(keys: RunKeys, redis_client: redis.Redis, redis_server: RedisServer) -> Iterator[str]:
    run = RunConfig(run_id=keys.run_id)
    bootstrap = ClusterBootstrap(
        run_id=run.run_id,
        run_config_toml=f'run_id = "{run.run_id}"\n',
        weights_public_key=PUBLIC_KEY_HEX,
        model=run.model,
    )
    with served_coordinator(run, redis_client, bootstrap=bootstrap) as served:
        yield served.url


def test_relay_rl_worker_says_why_it_cannot_join(served_bootstrap: str, tmp_path: Path) -> None:
    url = served_bootstrap
    refused = relay_rl_worker("--coordinator", url, "--token", "not-the-join-token-0123", tmp_path=tmp_path)
    assert refused.returncode == 3, refused.stderr
    assert "refused the join token (HTTP 401" in refused.stderr and "Traceback" not in refused.stderr

    other_key = generate_key_pair().public_key_hex
    pinned = relay_rl_worker("--coordinator", url, "--token", JOIN_TOKEN, "--public-key", other_key, tmp_path=tmp_path)
    assert pinned.returncode == 1 and "is pinned" in pinned.stderr, pinned.stderr
    assert not (tmp_path / "work").exists()  # nothing written for a cluster it refused

    unreachable = relay_rl_worker(
        "--coordinator", f"http://127.0.0.1:{free_port()}", "--token", JOIN_TOKEN, tmp_path=tmp_path
    )
    assert unreachable.returncode == 4 and "cannot reach the coordinator" in unreachable.stderr, unreachable.stderr

    no_coordinator = relay_rl_worker("--token", JOIN_TOKEN, tmp_path=tmp_path)
    assert no_coordinator.returncode == 2 and "--coordinator" in no_coordinator.stderr


def test_a_coordinator_without_a_public_key_answers_404_and_the_worker_says_so(
    keys: RunKeys, redis_client: redis.Redis, tmp_path: Path
) -> None:
    with served_coordinator(RunConfig(run_id=keys.run_id), redis_client) as served:
        answer = served.client.get(BOOTSTRAP_PATH)  # with the join token
        assert answer.status_code == 404 and "RL_WEIGHTS_PUBLIC_KEY" in answer.json()["detail"]
        result = relay_rl_worker("--coordinator", served.url, "--token", JOIN_TOKEN, tmp_path=tmp_path)
    assert result.returncode == 1 and "HTTP 404" in result.stderr and "RL_WEIGHTS_PUBLIC_KEY" in result.stderr
