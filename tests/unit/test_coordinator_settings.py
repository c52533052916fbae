"""The coordinator's environment settings and its command line (fast `--help`, no torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.coordinator.settings import CoordinatorSettings
from shared.service_entry import environment_variable

# what the coordinator imports only once it serves (services/coordinator/__main__.py), and torch's family; its
# settings (pydantic-settings) are read for --help, which lists them
HEAVY_PACKAGES = {
    "fastapi",
    "starlette",
    "uvicorn",
    "redis",
    "httpx",
    "torch",
    "transformers",
}


def test_settings_come_from_rl_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setenv("RL_JOIN_TOKEN", "join-token-0123456789")
    monkeypatch.setenv("RL_COORDINATOR_HOST", "0.0.0.0")
    monkeypatch.setenv("RL_COORDINATOR_PORT", "9123")
    monkeypatch.setenv("RL_REDIS_URL", "redis://redis:6379/0")

    settings = CoordinatorSettings()

    assert (settings.host, settings.port, settings.redis_url) == ("0.0.0.0", 9123, "redis://redis:6379/0")
    assert settings.admin_token.get_secret_value() == "admin-token-0123456789"
    assert "admin-token" not in repr(settings) and "admin-token" not in str(settings.model_dump(mode="json"))


def test_defaults_bind_localhost_port_8000(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RL_COORDINATOR_HOST", raising=False)
    monkeypatch.delenv("RL_COORDINATOR_PORT", raising=False)
    monkeypatch.setenv("RL_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setenv("RL_JOIN_TOKEN", "join-token-0123456789")
    settings = CoordinatorSettings()
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)


def test_admin_token_is_required_and_not_trivially_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RL_ADMIN_TOKEN", raising=False)
    with pytest.raises(ValidationError, match="RL_ADMIN_TOKEN"):
        CoordinatorSettings()
    monkeypatch.setenv("RL_ADMIN_TOKEN", "short")
    with pytest.raises(ValidationError, match="RL_ADMIN_TOKEN"):
        CoordinatorSettings()


def test_bad_port_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setenv("RL_JOIN_TOKEN", "join-token-0123456789")
    monkeypatch.setenv("RL_COORDINATOR_PORT", "70000")
    with pytest.raises(ValidationError, match="RL_COORDINATOR_PORT"):
        CoordinatorSettings()


def test_help_answers_fast_and_lists_the_environment(repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "services.coordinator", "--help"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    # every variable the settings read, from the settings themselves (shared.service_entry.environment_help)
    for name in CoordinatorSettings.model_fields:
        assert environment_variable(CoordinatorSettings, name) in result.stdout, name
    assert "RL_ADMIN_TOKEN" in result.stdout and "RL_COORDINATOR_PORT" in result.stdout
    # fast: what makes a start slow is imports, and --help answers before the server stack is imported
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "services" in imported  # the import log is there to read
    assert not imported & HEAVY_PACKAGES, sorted(imported & HEAVY_PACKAGES)


def test_the_whole_coordinator_imports_without_torch(repo_root: Path) -> None:
    # every module of the package (found on disk, so a new or moved module is covered too) and its contract
    package_dir = repo_root / "services" / "coordinator"
    modules = sorted(
        ".".join(path.relative_to(package_dir).with_suffix("").parts)
        for path in package_dir.rglob("*.py")
        if path.name not in {"__init__.py", "__main__.py"}
    )
    assert "app" in modules and len(modules) > 10
    script = (
        "import sys\n"
        + "".join(f"import services.coordinator.{m}\n" for m in modules)
        + "import shared.api\n"
        + (
            "import services.coordinator.__main__ as main\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'vllm'})\n"
            "assert not heavy, heavy\n"
        )
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_join_token_is_required_unless_registration_is_explicitly_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.delenv("RL_JOIN_TOKEN", raising=False)
    monkeypatch.delenv("RL_OPEN_REGISTRATION", raising=False)
    with pytest.raises(ValidationError, match="RL_JOIN_TOKEN"):
        CoordinatorSettings()
    monkeypatch.setenv("RL_JOIN_TOKEN", "short")
    with pytest.raises(ValidationError, match="RL_JOIN_TOKEN"):
        CoordinatorSettings()
    monkeypatch.delenv("RL_JOIN_TOKEN")
    monkeypatch.setenv("RL_OPEN_REGISTRATION", "true")
    assert CoordinatorSettings().join_token_value() is None
    monkeypatch.setenv("RL_JOIN_TOKEN", "join-token-0123456789")
    settings = CoordinatorSettings()
    assert settings.join_token_value() == "join-token-0123456789" and "join-token" not in repr(settings)
