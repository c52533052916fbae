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


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.sub(r"[-_.]+", "-", re.split(r"[<>=!\[ ;]", requirement)[0]).lower() for requirement in requirements}


def test_each_variant_installs_a_locked_set_that_covers_the_projects_requirements(
    dockerfile: str, repo_root: Path
) -> None:
    """`make docker-lock` pins every package; a dependency added to pyproject.toml without a new lock fails here."""
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    cpu = _pins(repo_root / "docker" / "requirements-cpu.txt")
    gpu = _pins(repo_root / "docker" / "requirements-gpu.txt")
    assert _requirement_names(project["dependencies"] + extras["train"] + extras["tasks"]) <= cpu.keys()
    assert (
        _requirement_names(project["dependencies"] + extras["train"] + extras["tasks"] + extras["vllm"]) <= gpu.keys()
    )
    for requirement in project["dependencies"] + extras["train"] + extras["tasks"] + extras["vllm"]:
        if "==" in requirement:  # the project's own exact pins hold in the locks
            name, version = requirement.split("==")
            assert (cpu if name != "vllm" else gpu)[_requirement_names([name]).pop()] == version, requirement
    # the CPU image's torch is the CPU build, installed on its own: no CUDA package may be in its lock
    assert "torch" not in cpu and not any(name.startswith("nvidia-") for name in cpu)
    assert re.search(r'cpu\) pip install --no-deps "torch==2\.13\.0\+cpu" --index-url "\$TORCH_INDEX_URL"', dockerfile)
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile
    assert (
        "-r /tmp/requirements/requirements-cpu.txt" in dockerfile
        and "-r /tmp/requirements/requirements-gpu.txt" in dockerfile
    )
    assert "pip install --no-deps -e ." in dockerfile  # the project itself adds nothing unlocked
    assert 'CMD ["relay-rl", "--help"]' in dockerfile


def test_the_compiler_stays_in_the_builder_stage(dockerfile: str) -> None:
    """pycosat (reasoning-gym) compiles at install: gcc in the builder, none in the image the services run."""
    builder, runtime = dockerfile.split("\nFROM ${BASE_IMAGE}\n")
    assert "FROM ${BASE_IMAGE} AS builder" in builder and "gcc" in builder
    assert "gcc" not in runtime and "apt-get" not in runtime
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.\d+-slim-bookworm$", dockerfile, flags=re.MULTILINE)


def test_the_secrets_file_is_kept_out_of_git_and_out_of_the_build_context(repo_root: Path) -> None:
    """`.env` holds the learner's signing key and every Redis password (docker compose reads it); tls/ beside it the
    coordinator's private key (make keys)."""
    for ignore_file in (".gitignore", ".dockerignore"):
        patterns = [line.strip() for line in (repo_root / ignore_file).read_text().splitlines()]
        assert ".env" in patterns, ignore_file
        assert "tls" in [pattern.strip("/") for pattern in patterns], ignore_file
