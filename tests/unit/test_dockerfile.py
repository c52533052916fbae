"""The Dockerfile cannot be built here (no Docker engine): check that the one image holds what the
services and `relay-rl worker` need, for both variants, and that it installs the project as a wheel (not
editable), whose files pyproject.toml names in full."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def dockerfile(repo_root: Path) -> str:
    return (repo_root / "Dockerfile").read_text()


def _stages(dockerfile: str) -> dict[str, str]:
    """Each stage's lines by its name (`FROM ... AS name`); the unnamed last stage, the image, is "runtime"."""
    stages = {}
    for block in re.split(r"^(?=FROM )", dockerfile, flags=re.MULTILINE)[1:]:
        named = re.match(r"FROM \S+ AS (\w+)", block)
        stages[named.group(1) if named else "runtime"] = block
    return stages


def _setuptools(repo_root: Path) -> dict:
    return tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"]


def _packaged_folders(repo_root: Path) -> list[str]:
    """The top-level folders pyproject.toml packages (its `packages.find` includes)."""
    includes = _setuptools(repo_root)["packages"]["find"]["include"]
    return [pattern.rstrip("*") for pattern in includes if (repo_root / pattern.rstrip("*")).is_dir()]


def test_the_wheel_is_built_from_every_package_the_project_installs(dockerfile: str, repo_root: Path) -> None:
    stages = _stages(dockerfile)
    copied = set(re.findall(r"^COPY (\S+) \./\S+$", stages["wheel"], flags=re.MULTILINE))
    assert set(_packaged_folders(repo_root)) <= copied and "COPY pyproject.toml ./" in stages["wheel"]
    # from the builder: its environment has pip and setuptools, which a base image need not have (CI's stand-in)
    assert stages["wheel"].startswith("FROM builder AS wheel")
    assert re.search(
        r"^RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels \.$", stages["wheel"], flags=re.MULTILINE
    )


def test_the_image_installs_the_project_as_a_wheel_not_editable(dockerfile: str) -> None:
    """The services import the project from site-packages: the image holds no source folder to import instead,
    and no install is editable (`-e`, `--editable`)."""
    runtime = _stages(dockerfile)["runtime"]
    installs = re.findall(r"pip install[^\n]*(?:\\\n[^\n]*)*", dockerfile)
    assert installs and not [line for line in installs if re.search(r"\s(-e|--editable)\b", line)]
    assert "COPY --from=wheel /wheels /tmp/wheels" in runtime
    assert re.search(r"pip install [^\n]*--no-deps /tmp/wheels/relay_rl-\*\.whl", runtime)
    assert "pip check" in runtime  # the wheel's requirements are all in the locked environment
    copied = set(re.findall(r"^COPY (\S+) \./\S+$", runtime, flags=re.MULTILINE))
    assert copied == {"configs"}  # the run files the chart and compose point at; no package's sources
    assert "COPY pyproject.toml" not in runtime


def test_the_wheel_carries_every_file_of_its_packages(repo_root: Path) -> None:
    """A folder of Python files without `__init__.py` is left out of the wheel (packages.find finds packages
    only), and so is a data file no `package-data` pattern of its package names."""
    package_data = _setuptools(repo_root).get("package-data", {})
    missing = []
    for folder in _packaged_folders(repo_root):
        for path in sorted((repo_root / folder).rglob("*")):
            relative = path.relative_to(repo_root)
            if "__pycache__" in relative.parts or path.suffix == ".pyc":
                continue
            if path.is_dir():
                if any(path.glob("*.py")) and not (path / "__init__.py").is_file():
                    missing.append(f"{relative}/__init__.py")
                continue
            if path.suffix == ".py":
                continue
            package = next(parent for parent in relative.parents if (repo_root / parent / "__init__.py").is_file())
            patterns = [*package_data.get(".".join(package.parts), []), *package_data.get("*", [])]
            if not any(fnmatch.fnmatch(relative.relative_to(package).as_posix(), pattern) for pattern in patterns):
                missing.append(str(relative))
    assert missing == []
    assert "static/*" in package_data["services.coordinator"]  # the dashboard page the coordinator serves


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
    assert "--no-deps /tmp/wheels/relay_rl-*.whl" in dockerfile  # the project itself adds nothing unlocked
    assert 'CMD ["relay-rl", "--help"]' in dockerfile


def test_the_compiler_stays_in_the_builder_stage(dockerfile: str) -> None:
    """pycosat (reasoning-gym) compiles at install: gcc in the builder, none in the image the services run (the
    wheel's stage starts from the builder but installs nothing: the project is pure Python)."""
    stages = _stages(dockerfile)
    assert list(stages) == ["builder", "wheel", "runtime"]
    assert stages["builder"].startswith("FROM ${BASE_IMAGE} AS builder") and "gcc" in stages["builder"]
    for name in ("wheel", "runtime"):
        assert "gcc" not in stages[name] and "apt-get" not in stages[name], name
    assert stages["runtime"].startswith("FROM ${BASE_IMAGE}\n")
    assert "COPY --from=builder /opt/venv /opt/venv" in stages["runtime"]
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.\d+-slim-bookworm$", dockerfile, flags=re.MULTILINE)


def test_the_secrets_file_is_kept_out_of_git_and_out_of_the_build_context(repo_root: Path) -> None:
    """`.env` holds the learner's signing key and every Redis password (docker compose reads it); tls/ beside it the
    coordinator's private key (make keys)."""
    for ignore_file in (".gitignore", ".dockerignore"):
        patterns = [line.strip() for line in (repo_root / ignore_file).read_text().splitlines()]
        assert ".env" in patterns, ignore_file
        assert "tls" in [pattern.strip("/") for pattern in patterns], ignore_file
