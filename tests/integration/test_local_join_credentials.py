"""A worker added to a local cluster from its cluster.env (`make worker` = `relay-rl worker`, `python -m cluster.join`;
cluster/join.py) joins with a join credential issued for it through the admin token there, named after it, so it
has a budget and a record of its own; `--shared-token` takes the demo's shared token. Against the real coordinator
app under uvicorn and a real redis-server."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cluster.cli import build_parser
from cluster.join import CredentialNotIssuedError, local_join_token
from cluster.ports import free_port
from cluster.remote_worker import EXIT_FAILED, EXIT_UNREACHABLE, JoinError, take_local_cluster
from shared.api import JOIN_TOKEN_HEADER, OPERATORS_PATH, OperatorInfo, WorkerInfo
from shared.config import RunConfig
from shared.keys import RunKeys
from tests.coordinator_rest import ADMIN_TOKEN, JOIN_TOKEN, ServeCoordinator, bearer

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]


def cluster_env(url: str, run_dir: Path, **overrides: str) -> dict[str, str]:
    """What cluster.local writes to <run dir>/cluster.env (cluster/local.py write_cluster_env)."""
    values = {
        "RL_RUN_CONFIG": str(REPO_ROOT / "configs" / "demo.toml"),
        "RL_RUN_ID": "local",
        "RL_RUN_DIR": str(run_dir),
        "RL_MODEL_DIR": str(run_dir / "model"),
        "RL_COORDINATOR_URL": url,
        "RL_WEIGHTS_PUBLIC_KEY": "00" * 32,
        "RL_JOIN_TOKEN": JOIN_TOKEN,
        "RL_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    values.update(overrides)
    (run_dir / "cluster.env").write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    return values


def operator_of(url: str, join_token: str) -> str:
    """Register with `join_token`; the id of the credential the worker carries ("": the shared token)."""
    response = httpx.post(f"{url}/v1/workers", json={"name": "w"}, headers={JOIN_TOKEN_HEADER: join_token})
    assert response.status_code == 201, response.text
    worker_id = response.json()["worker_id"]
    return WorkerInfo.model_validate(httpx.get(f"{url}/v1/workers/{worker_id}").json()).operator_id


def operator_names(url: str) -> dict[str, str]:
    listed = httpx.get(url + OPERATORS_PATH, headers=bearer(ADMIN_TOKEN)).json()
    return {info.operator_id: info.name for info in (OperatorInfo.model_validate(o) for o in listed)}


def worker_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["worker", *argv])


def test_make_worker_joins_with_a_credential_issued_for_it(
    serve_coordinator: ServeCoordinator, keys: RunKeys, tmp_path: Path
) -> None:
    url = serve_coordinator(RunConfig(run_id=keys.run_id)).url
    cluster_env(url, tmp_path)
    args = worker_args("--name", "gpu-a", "--run-dir", str(tmp_path))  # what `make worker NAME=gpu-a` parses
    take_local_cluster(args)
    assert args.coordinator == url and args.token != JOIN_TOKEN
    operator_id = operator_of(url, args.token)
    assert operator_id.startswith("op-") and operator_names(url) == {operator_id: "gpu-a"}

    shared = worker_args("--name", "trusted", "--run-dir", str(tmp_path), "--shared-token")
    take_local_cluster(shared)
    assert shared.token == JOIN_TOKEN and operator_of(url, shared.token) == ""
    assert len(operator_names(url)) == 1  # nothing issued for it


def test_python_m_cluster_join_issues_one_too(
    serve_coordinator: ServeCoordinator, keys: RunKeys, tmp_path: Path
) -> None:
    url = serve_coordinator(RunConfig(run_id=keys.run_id)).url
    cluster_env(url, tmp_path)
    printed = subprocess.run(
        [sys.executable, "-m", "cluster.join", "--run-dir", str(tmp_path), "--name", "by-hand", "--print-env"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in printed.stdout.splitlines() if "=" in line)
    assert "RL_ADMIN_TOKEN" not in exports  # the admin token stays out of the worker's environment
    operator_id = operator_of(url, exports["RL_JOIN_TOKEN"])
    assert operator_names(url)[operator_id] == "by-hand" and operator_id in printed.stderr


def test_without_the_admin_token_the_shared_token_and_a_refusal_says_why(
    serve_coordinator: ServeCoordinator, keys: RunKeys, tmp_path: Path
) -> None:
    url = serve_coordinator(RunConfig(run_id=keys.run_id)).url
    without_admin = {name: value for name, value in cluster_env(url, tmp_path).items() if name != "RL_ADMIN_TOKEN"}
    assert local_join_token(without_admin, "w", shared_token=False) == JOIN_TOKEN

    cluster_env(url, tmp_path, RL_ADMIN_TOKEN="not-the-admin-token-0123")
    with pytest.raises(JoinError) as refused:
        take_local_cluster(worker_args("--name", "w", "--run-dir", str(tmp_path)))
    assert refused.value.exit_code == EXIT_FAILED and "HTTP 401" in str(refused.value)

    cluster_env(url, tmp_path, RL_COORDINATOR_URL=f"http://127.0.0.1:{free_port()}")  # nobody listening
    with pytest.raises(JoinError) as unreachable:
        take_local_cluster(worker_args("--name", "w", "--run-dir", str(tmp_path)))
    assert unreachable.value.exit_code == EXIT_UNREACHABLE
    assert isinstance(unreachable.value.__cause__, CredentialNotIssuedError)
