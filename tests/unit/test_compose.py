"""docker-compose.yml cannot be run here (no Docker engine): check its structure instead."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

LONG_RUNNING = ["redis", "coordinator", "reward", "learner"]
ONE_SHOT = ("init-model", "redis-acl")  # steps that run once before the services start
TRUSTED = ("coordinator", "reward", "learner")  # each logs in to Redis as its own user


@pytest.fixture(scope="module")
def compose(repo_root: Path) -> dict:
    return yaml.safe_load((repo_root / "docker-compose.yml").read_text())


def test_every_service_of_the_architecture_is_there_with_at_least_three_workers(compose: dict) -> None:
    services = compose["services"]
    for name in LONG_RUNNING:
        assert name in services
    assert len([name for name in services if name.startswith("worker-")]) >= 3


def test_python_services_run_modules_that_exist_from_one_image(compose: dict, repo_root: Path) -> None:
    images = set()
    for name, service in compose["services"].items():
        if name == "redis":
            continue
        command = service["command"]
        assert command[:2] == ["python", "-m"], name
        spec = importlib.util.find_spec(command[2])
        assert spec is not None, f"{name} runs missing module {command[2]}"
        if spec.submodule_search_locations:  # a package: `python -m` runs its __main__
            assert importlib.util.find_spec(command[2] + ".__main__") is not None, f"{command[2]} has no __main__"
        assert service["build"] == "."
        images.add(service["image"])
    assert len(images) == 1
    assert (repo_root / "Dockerfile").exists()


def test_every_service_has_the_restart_policy_the_local_runner_applies(compose: dict) -> None:
    """As cluster/local.py does: Redis, coordinator and reward come back from any exit; the learner and
    the workers only from a failure (exit 0: the run is complete, the worker was drained); the one-shot
    steps (the model builder, the Redis ACL file writer) never."""
    from cluster.supervisor import RestartMode

    for name, service in compose["services"].items():
        if name in ("init-model", "redis-acl"):
            expected = "no"
        elif name == "learner" or name.startswith("worker-"):
            expected = RestartMode.ON_FAILURE.value
        else:
            expected = RestartMode.UNLESS_STOPPED.value
        assert service.get("restart") == expected, name


def test_redis_keeps_an_append_only_file(compose: dict) -> None:
    command = " ".join(compose["services"]["redis"]["command"])
    assert "--appendonly yes" in command


def test_long_running_services_have_healthchecks_and_wait_for_healthy_dependencies(compose: dict) -> None:
    services = compose["services"]
    for name, service in services.items():
        if name in ONE_SHOT:
            continue
        assert service["healthcheck"]["test"], name
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            expected = "service_completed_successfully" if dependency in ONE_SHOT else "service_healthy"
            assert condition == {"condition": expected}, f"{name} -> {dependency}"
    for name in ["coordinator", "reward", "learner", "worker-0"]:
        assert "redis" in services[name]["depends_on"] or "coordinator" in services[name]["depends_on"]


def test_services_reach_redis_and_each_other_by_compose_names_and_secrets_have_no_default(compose: dict) -> None:
    for name, service in compose["services"].items():
        if name in ("redis", *ONE_SHOT):
            continue
        env = service["environment"]
        if name in TRUSTED:  # its own Redis user, its password a secret without default
            assert env["RL_REDIS_URL"].startswith(f"redis://{name}:${{RL_REDIS_PASSWORD_{name.upper()}:?"), name
            assert env["RL_REDIS_URL"].endswith("@redis:6379/0"), name
        else:  # a worker: no Redis at all, it works through the coordinator's work API
            assert "RL_REDIS_URL" not in env, name
        assert env["RL_COORDINATOR_URL"] == "https://coordinator:8000", name
        assert env["RL_WEIGHTS_PUBLIC_KEY"].startswith("${RL_WEIGHTS_PUBLIC_KEY:?"), name
        assert "RL_CLUSTER_KEY" not in env, name


def test_workers_join_with_the_operator_credential_the_coordinator_provisions(compose: dict) -> None:
    """No shared join token: the coordinator provisions RL_OPERATOR_TOKEN as a credential of its own (a budget, a
    record, quarantine that sticks) and the workers send it; the learner and reward service get neither."""
    provisioned = "${RL_OPERATOR_TOKEN:?"
    for name, service in compose["services"].items():
        env = service.get("environment", {})
        if name.startswith("worker-"):
            assert env["RL_JOIN_TOKEN"].startswith(provisioned) and "RL_OPERATOR_TOKENS" not in env, name
        elif name == "coordinator":
            assert env["RL_OPERATOR_TOKENS"].startswith(provisioned) and "RL_JOIN_TOKEN" not in env
        else:
            assert "RL_JOIN_TOKEN" not in env and "RL_OPERATOR_TOKENS" not in env, name


def test_only_the_coordinator_gets_the_admin_token(compose: dict) -> None:
    """The admin token drains and releases any worker and issues join credentials: a worker holding it
    could do all of that, so only the service that checks it gets it."""
    holders = [
        name for name, service in compose["services"].items() if "RL_ADMIN_TOKEN" in service.get("environment", {})
    ]
    assert holders == ["coordinator"]
    assert compose["services"]["coordinator"]["environment"]["RL_ADMIN_TOKEN"].startswith("${RL_ADMIN_TOKEN:?")


def test_only_the_learner_gets_the_private_signing_key(compose: dict) -> None:
    holders = [
        name for name, service in compose["services"].items() if "RL_SIGNING_KEY" in service.get("environment", {})
    ]
    assert holders == ["learner"]
    assert compose["services"]["learner"]["environment"]["RL_SIGNING_KEY"].startswith("${RL_SIGNING_KEY:?")


def test_redis_runs_with_acls_and_only_trusted_services_have_users(compose: dict) -> None:
    services = compose["services"]
    assert "--aclfile /data/users.acl" in " ".join(services["redis"]["command"])
    assert services["redis-acl"]["command"][:3] == ["python", "-m", "cluster.redis_acl"]
    assert services["redis"]["depends_on"]["redis-acl"] == {"condition": "service_completed_successfully"}
    assert "RL_REDIS_PASSWORD_OPERATOR" in " ".join(services["redis"]["healthcheck"]["test"])


def test_make_keys_writes_every_variable_the_compose_file_requires(repo_root: Path, tmp_path: Path) -> None:
    """`make keys` (relay-rl keys --compose --out .env) covers every `${NAME:?...}` of the compose file, and
    nothing it writes is a variable the file does not read."""
    import re

    from cluster.secrets import TLS_DIR_VARIABLE, ClusterSecrets

    text = (repo_root / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{(RL_[A-Z_]+):\?", text))
    env = ClusterSecrets.generate().compose_env(tmp_path / "tls")
    assert set(env) == required
    assert len(required) == 9
    assert env.pop(TLS_DIR_VARIABLE) == str((tmp_path / "tls").resolve())  # a folder: the secrets' files are in it
    # URL-safe, no quoting; the workers' credential as the coordinator's own issue makes them (op-<id>.<secret>)
    assert all(re.fullmatch(r"(op-[0-9a-f]{12}\.)?[0-9a-f]{48,64}", value) for value in env.values())


def test_the_coordinator_serves_https_and_every_worker_verifies_it_with_the_run_ca(compose: dict) -> None:
    """Workers send the coordinator tokens over the compose network (not loopback), so it serves https with the
    certificate and key `make keys` made, as compose secrets only it mounts; each worker gets the CA alone and
    verifies the coordinator with it before a token goes out (shared/tls.py)."""
    services = compose["services"]
    tls_files = {name: secret["file"] for name, secret in compose["secrets"].items()}
    assert tls_files == {
        "coordinator_tls_cert": "${RL_TLS_DIR:?set RL_TLS_DIR (make keys)}/server.pem",
        "coordinator_tls_key": "${RL_TLS_DIR:?set RL_TLS_DIR (make keys)}/server.key",
        "coordinator_ca": "${RL_TLS_DIR:?set RL_TLS_DIR (make keys)}/ca.pem",
    }
    coordinator = services["coordinator"]
    assert coordinator["environment"]["RL_TLS_CERT_FILE"] == "/run/secrets/coordinator_tls_cert"
    assert coordinator["environment"]["RL_TLS_KEY_FILE"] == "/run/secrets/coordinator_tls_key"
    assert "https://127.0.0.1:8000/healthz" in " ".join(coordinator["healthcheck"]["test"])
    holders = [name for name, service in services.items() if "coordinator_tls_key" in service.get("secrets", [])]
    assert holders == ["coordinator"]
    for name, service in services.items():
        if name.startswith("worker-"):
            assert service["secrets"] == ["coordinator_ca"], name
            assert service["environment"]["RL_COORDINATOR_CA_FILE"] == "/run/secrets/coordinator_ca", name


def test_each_worker_has_its_own_name_port_and_advertised_address(compose: dict) -> None:
    """Every chunk server (the learner's and each worker's) is published on the host and advertised as
    http://${RL_PUBLIC_HOST:-<compose name>}:<port>, the same port inside and out: with RL_PUBLIC_HOST set,
    a worker on another machine reaches any of them, and they reach it."""
    services = compose["services"]
    workers = {name: service for name, service in services.items() if name.startswith("worker-")}
    names, ports = set(), set()
    for name, service in workers.items():
        env = service["environment"]
        port = env["RL_WORKER_PORT"]
        assert env["RL_WORKER_PUBLIC_URL"] == f"http://${{RL_PUBLIC_HOST:-{name}}}:{port}"
        assert service["ports"] == [f"{port}:{port}"]
        assert f"127.0.0.1:{port}/healthz" in " ".join(service["healthcheck"]["test"])
        names.add(env["RL_WORKER_NAME"])
        ports.add(port)
    assert len(names) == len(ports) == len(workers)
    learner = services["learner"]
    assert learner["environment"]["RL_LEARNER_PUBLIC_URL"] == "http://${RL_PUBLIC_HOST:-learner}:8100"
    assert learner["ports"] == ["8100:8100"]
