"""The local cluster's weight-signing keys: a fresh Ed25519 pair per run, the private half in the
learner's environment only; workers (and cluster.env, which `cluster.join` hands to workers) get the
public half. Checked on real child processes: their environment as the kernel holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions, LocalCluster
from cluster.redis_server import RedisServer
from services.rollout.settings import RolloutSettings
from shared.signing import generate_key_pair

pytestmark = pytest.mark.integration


def environment_of(pid: int) -> dict[str, str]:
    """A running process's environment (Popen returns only once the child has exec'd, so this is the
    service's own, not the parent's copied at fork)."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


def test_only_the_learner_process_gets_the_private_signing_key(
    redis_server: RedisServer, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a signing key exported in the user's shell (e.g. for docker compose) must not reach workers either
    monkeypatch.setenv("RL_SIGNING_KEY", generate_key_pair().signing_key_hex)
    cluster = LocalCluster(
        ClusterOptions(config_path=repo_root / "tests/e2e/cluster_test.toml", runs_dir=tmp_path / "runs")
    )
    cluster.run_dir.mkdir(parents=True)
    cluster.redis = redis_server
    cluster.coordinator_url = "http://127.0.0.1:9"  # nothing listens: the services wait for it, which is enough
    pair = cluster.weights_keys
    assert pair.signing_key_hex != generate_key_pair().signing_key_hex  # made for this run

    cluster_env = cluster.write_cluster_env().read_text()
    assert f"RL_WEIGHTS_PUBLIC_KEY={pair.public_key_hex}" in cluster_env
    assert pair.signing_key_hex not in cluster_env and "RL_SIGNING_KEY" not in cluster_env

    try:
        cluster.start_worker(0)
        cluster.start_learner()
        worker = environment_of(cluster.services["worker-0"].pid)
        learner = environment_of(cluster.services["learner"].pid)
    finally:
        for process in cluster.services.values():
            process.kill()
    assert worker["RL_WEIGHTS_PUBLIC_KEY"] == pair.public_key_hex
    assert "RL_SIGNING_KEY" not in worker and "RL_CLUSTER_KEY" not in worker
    assert not any(pair.signing_key_hex in value for value in worker.values())
    assert learner["RL_SIGNING_KEY"] == pair.signing_key_hex
    assert learner["RL_WEIGHTS_PUBLIC_KEY"] == pair.public_key_hex
    # Redis: the learner logs in as its own user; the worker gets no Redis at all, nor the admin token
    assert learner["RL_REDIS_URL"].startswith("redis://learner:") and "RL_REDIS_URL" not in worker
    assert not any(password in " ".join(worker.values()) for password in cluster.redis_users.passwords.values())
    assert "RL_ADMIN_TOKEN" not in worker and cluster.admin_token not in " ".join(worker.values())
    assert f"RL_ADMIN_TOKEN={cluster.admin_token}" in cluster_env  # the operator's tools read it there
    # and a worker's settings have no place for a private key
    assert {"signing_key", "cluster_key"}.isdisjoint(RolloutSettings.model_fields)
