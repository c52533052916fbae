"""The chart's Redis pod run here as processes (no cluster): its init container's script, as rendered,
writes the ACL file from the passwords Secret onto the volume; redis-server loads it; the coordinator's
code logs in with the chart's RL_REDIS_URL. After a pod restart (the init script again, with a rotated
password, then a new redis-server on the same volume) the trusted users have the Secret's passwords, and
the default user is still off. (Workers have no Redis users: they go through the coordinator's work API.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cluster.redis_server import RedisServer
from shared.bus import connect
from tests.helm_chart import REPO_ROOT, VALUES, Container, containers, find, render, resolved_env, secret_values

pytestmark = pytest.mark.integration


def run_init_script(init: Container, env: dict[str, str], data_dir: Path, scratch: Path) -> None:
    """The init container's shell script with its volume at `data_dir` (and its /tmp at `scratch`)."""
    script = init.command[-1].replace("/tmp/worker-users.acl", f"{scratch}/worker-users.acl")
    script = script.replace("/data/users.acl", f"{data_dir}/users.acl")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `python` is this environment's
    subprocess.run(["sh", "-c", script], env={**env, "PATH": path}, cwd=REPO_ROOT, check=True, timeout=60)


def local_url(url: str, port: int) -> str:
    """The chart's in-cluster Redis URL pointed at this test's server (same user and password)."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{port}").geturl()


def test_trusted_passwords_follow_the_secret_across_a_redis_pod_restart(tmp_path: Path) -> None:
    objects = render([VALUES / "cpu-demo.yaml", secret_values(tmp_path)], REPO_ROOT / "configs/demo.toml")
    (init,) = [c for c in containers([find(objects, "StatefulSet", "-redis")]) if c.init]
    init_env = resolved_env(init, objects)
    coordinator = next(c for c in containers([find(objects, "Deployment", "-coordinator")]) if not c.init)
    coordinator_url = resolved_env(coordinator, objects)["RL_REDIS_URL"]
    data_dir, scratch = tmp_path / "data", tmp_path / "scratch"
    data_dir.mkdir()
    scratch.mkdir()

    run_init_script(init, init_env, data_dir, scratch)
    operator = ("operator", init_env["RL_REDIS_PASSWORD_OPERATOR"])
    server = RedisServer(data_dir, acl_file=data_dir / "users.acl", probe_user=operator).start()
    try:
        client = connect(local_url(coordinator_url, server.port))
        assert client.ping()  # the coordinator's code, logged in as the chart configures it
        client.close()
    finally:
        server.stop()

    rotated = {**init_env, "RL_REDIS_PASSWORD_LEARNER": "rotated-learner-password"}
    run_init_script(init, rotated, data_dir, scratch)  # the pod's next start
    server = RedisServer(data_dir, acl_file=data_dir / "users.acl", probe_user=operator).start()
    try:
        for user in ("coordinator", "reward", "learner"):
            password = rotated[f"RL_REDIS_PASSWORD_{user.upper()}"]
            trusted = redis.Redis(port=server.port, username=user, password=password)
            assert trusted.ping(), user
            trusted.close()
        # no retries: redis-py retries a refused login with backoff (~3 s each) by default
        no_retry = Retry(NoBackoff(), 0)
        stale = redis.Redis(
            port=server.port, username="learner", password=init_env["RL_REDIS_PASSWORD_LEARNER"], retry=no_retry
        )
        with pytest.raises(redis.AuthenticationError):
            stale.ping()
        anonymous = redis.Redis(port=server.port, retry=no_retry)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
    finally:
        server.stop()
