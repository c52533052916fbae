"""relay-rl installed as a wheel, away from the source checkout (what `pip install relay-rl` gives a worker
machine): the commands a worker machine needs work; demo and bench say they need a checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PACKAGES = ("shared", "services", "engines", "cluster", "simulator")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, repo_root: Path) -> Path:
    """The project's wheel (built from a copy of its sources) unpacked into a folder of its own."""
    work = tmp_path_factory.mktemp("installed")
    source = work / "source"
    source.mkdir()
    shutil.copy(repo_root / "pyproject.toml", source)
    for package in PACKAGES:
        shutil.copytree(repo_root / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    target = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    assert not (target / "configs").exists() and (target / "cluster" / "cli.py").exists()
    # package data ([tool.setuptools.package-data]): the page the coordinator serves, from the wheel as in the image
    assert (target / "services" / "coordinator" / "static" / "dashboard.html").is_file()
    return target


def _relay_rl(installed: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        cwd=installed.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_commands_of_a_worker_machine_work_from_a_wheel(installed: Path) -> None:
    keys = _relay_rl(installed, "keys", "--compose")
    assert keys.returncode == 0, keys.stderr
    names = [line.split("=", 1)[0] for line in keys.stdout.splitlines() if line.startswith("RL_")]
    assert len(names) == 9 and "RL_TLS_DIR" in names, names  # the secrets, and where the run CA's files went
    help_text = _relay_rl(installed, "worker", "--help")
    assert help_text.returncode == 0 and "--coordinator" in help_text.stdout


@pytest.mark.parametrize("args", [["demo"], ["bench", "signing"]], ids=["demo", "bench"])
def test_demo_and_bench_say_they_need_a_source_checkout(installed: Path, args: list[str]) -> None:
    result = _relay_rl(installed, *args)
    assert result.returncode == 1
    assert f"relay-rl {args[0]} runs from a source checkout" in result.stderr
    assert "Traceback" not in result.stderr
