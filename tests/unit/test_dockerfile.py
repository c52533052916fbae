"""The Dockerfile cannot be built here (no Docker engine): check that the one image holds what the
services and `relay-rl worker` need, for both variants."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def dockerfile(repo_root: Path) -> str:
    return (repo_root / "Dockerfile").read_text()


def test_the_image_copies_every_package_the_project_installs(dockerfile: str, repo_root: Path) -> None:
    pyproject = tomllib.loads((repo_root / "pyproject.toml").read_text())
    packages = [pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = set(re.findall(r"^COPY (\S+) \./\S+$", dockerfile, flags=re.MULTILINE))
    assert {package for package in packages if (repo_root / package).is_dir()} <= copied
    assert "configs" in copied  # the run files the chart and compose point at


def test_both_variants_install_the_services_extras_and_pin_torch_first(dockerfile: str, repo_root: Path) -> None:
    cpu = re.search(r"cpu\) (.*?);;", dockerfile, flags=re.DOTALL)
    gpu = re.search(r"gpu\) (.*?);;", dockerfile, flags=re.DOTALL)
    assert cpu is not None and gpu is not None
    assert re.search(
        r"torch==\S+ --index-url \S+/whl/cpu\s.*&& pip install .*-e \"\.\[train,tasks\]\"",
        cpu.group(1),
        flags=re.DOTALL,
    )
    assert re.search(r"vllm==\S+\s.*&& pip install .*-e \"\.\[vllm,train,tasks\]\"", gpu.group(1), flags=re.DOTALL)
    (vllm_pin,) = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert vllm_pin in gpu.group(1)  # the same vLLM as `make setup-vllm`
    assert 'CMD ["relay-rl", "--help"]' in dockerfile


def test_the_secrets_file_is_kept_out_of_git_and_out_of_the_build_context(repo_root: Path) -> None:
    """`.env` holds the learner's signing key and every Redis password (docker compose reads it)."""
    for ignore_file in (".gitignore", ".dockerignore"):
        patterns = [line.strip() for line in (repo_root / ignore_file).read_text().splitlines()]
        assert ".env" in patterns, ignore_file
