"""Every service starts with `python -m services.<name>`; `--help` answers without importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "module", ["services.coordinator", "services.reward", "services.rollout", "services.learner", "cluster.local"]
)
def test_help_answers_without_importing_torch(module: str, repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", module, "--help"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower()
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "torch" not in imported and "transformers" not in imported and "vllm" not in imported


@pytest.mark.parametrize("module", ["services.coordinator.app", "services.reward.service"])
def test_the_coordinator_and_reward_service_never_need_torch(module: str, repo_root: Path) -> None:
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
