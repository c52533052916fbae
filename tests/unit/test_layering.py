"""The layering, frozen: a new import that crosses a line fails here, naming the file and the import.

services/<x>   imports shared/ and engines/ only: never another service, the runner (cluster/) or benchmarks
shared/        the contracts between processes: imports no service, engine, runner, simulator or benchmark
engines/       imports shared/ only (of the project)
vLLM           imported by the vLLM engine alone: engines/vllm_engine.py and the sampler hook it installs
               into vLLM's own worker (engines/vllm_keyed_sampler.py); benchmarks/gpu.py also times bare
               vLLM as its baseline
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECT_PACKAGES = ("shared", "services", "engines", "cluster", "simulator", "benchmarks")
VLLM_IMPORTERS = {"engines/vllm_engine.py", "engines/vllm_keyed_sampler.py", "benchmarks/gpu.py"}


def _imports(path: Path) -> list[str]:
    """Absolute module names `path` imports (relative imports stay inside their package)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _crossings(repo_root: Path, package: str, allowed: set[str]) -> list[str]:
    """`file: import` for every import of a project package not in `allowed` from `package`'s files."""
    found = []
    for path in sorted((repo_root / package).rglob("*.py")):
        relative = path.relative_to(repo_root)
        own = relative.parts[1] if package == "services" and len(relative.parts) > 2 else None
        for name in _imports(path):
            top, *rest = name.split(".")
            if top not in PROJECT_PACKAGES or top in allowed:
                continue
            if top == package and (own is None or (rest and rest[0] == own)):
                continue
            found.append(f"{relative}: import {name}")
    return found


@pytest.mark.parametrize(
    ("package", "allowed"),
    [("services", {"shared", "engines"}), ("shared", set()), ("engines", {"shared"})],
    ids=["services", "shared", "engines"],
)
def test_each_layer_imports_only_what_is_below_it(repo_root: Path, package: str, allowed: set[str]) -> None:
    assert _crossings(repo_root, package, allowed) == []


def test_only_the_vllm_engine_imports_vllm(repo_root: Path) -> None:
    importers = {
        path.relative_to(repo_root).as_posix()
        for package in PROJECT_PACKAGES
        for path in (repo_root / package).rglob("*.py")
        if any(name.split(".")[0] == "vllm" for name in _imports(path))
    }
    assert importers <= VLLM_IMPORTERS
    assert "engines/vllm_engine.py" in importers


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The rule can fail: a service importing another service is reported."""
    (tmp_path / "services" / "learner").mkdir(parents=True)
    (tmp_path / "services" / "learner" / "loop.py").write_text(
        "from services.reward.service import X\nimport shared.bus\n"
    )
    assert _crossings(tmp_path, "services", {"shared", "engines"}) == [
        "services/learner/loop.py: import services.reward.service"
    ]
