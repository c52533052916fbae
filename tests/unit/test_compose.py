"""docker-compose.yml cannot be run here (no Docker engine): check its structure instead."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

LONG_RUNNING = ["redis", "coordinator", "reward", "learner"]


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


def test_redis_keeps_an_append_only_file(compose: dict) -> None:
    command = " ".join(compose["services"]["redis"]["command"])
    assert "--appendonly yes" in command


def test_long_running_services_have_healthchecks_and_wait_for_healthy_dependencies(compose: dict) -> None:
    services = compose["services"]
    for name, service in services.items():
        if name == "init-model":
            continue
        assert service["healthcheck"]["test"], name
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            expected = "service_completed_successfully" if dependency == "init-model" else "service_healthy"
            assert condition == {"condition": expected}, f"{name} -> {dependency}"
    for name in ["coordinator", "reward", "learner", "worker-0"]:
        assert "redis" in services[name]["depends_on"] or "coordinator" in services[name]["depends_on"]


def test_services_reach_redis_and_each_other_by_compose_names_and_secrets_have_no_default(compose: dict) -> None:
    for name, service in compose["services"].items():
        if name in ("redis", "init-model"):
            continue
        env = service["environment"]
        assert env["RL_REDIS_URL"] == "redis://redis:6379/0", name
        assert env["RL_COORDINATOR_URL"] == "http://coordinator:8000", name
        assert env["RL_ADMIN_TOKEN"].startswith("${RL_ADMIN_TOKEN:?"), name
        assert env["RL_WEIGHTS_PUBLIC_KEY"].startswith("${RL_WEIGHTS_PUBLIC_KEY:?"), name
        assert "RL_CLUSTER_KEY" not in env, name
        assert env["RL_JOIN_TOKEN"].startswith("${RL_JOIN_TOKEN:?"), name


def test_only_the_learner_gets_the_private_signing_key(compose: dict) -> None:
    holders = [
        name for name, service in compose["services"].items() if "RL_SIGNING_KEY" in service.get("environment", {})
    ]
    assert holders == ["learner"]
    assert compose["services"]["learner"]["environment"]["RL_SIGNING_KEY"].startswith("${RL_SIGNING_KEY:?")
