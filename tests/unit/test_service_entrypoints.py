"""Every service starts with `python -m services.<name>`; `--help` answers without importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.help_imports import help_and_imports


@pytest.mark.parametrize(
    "module",
    [
        "services.coordinator",
        "services.reward",
        "services.rollout",
        "services.learner",
        "cluster.local",
        "benchmarks.liar_worker",
    ],
)
def test_help_answers_without_importing_torch(module: str, repo_root: Path) -> None:
    _, imported = help_and_imports([module], repo_root)
    assert "torch" not in imported and "transformers" not in imported and "vllm" not in imported


@pytest.mark.parametrize("module", ["services.coordinator.app", "services.reward.service"])
def test_the_coordinator_and_reward_service_never_need_torch(module: str, repo_root: Path) -> None:
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_settings_log_line_carries_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis password in RL_REDIS_URL was logged in clear (issue 10, item 8)."""
    from services.coordinator.settings import CoordinatorSettings
    from shared.service_entry import describe_settings, redact_url_password

    monkeypatch.setenv("RL_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setenv("RL_JOIN_TOKEN", "join-token-0123456789")
    monkeypatch.setenv("RL_REDIS_URL", "rediss://coordinator:s3cret-pw@redis.example:6380/0")
    line = describe_settings(CoordinatorSettings())
    assert "s3cret-pw" not in line and "admin-token-0123456789" not in line
    assert "rediss://coordinator:***@redis.example:6380/0" in line
    assert redact_url_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url_password("configs/demo.toml") == "configs/demo.toml"
