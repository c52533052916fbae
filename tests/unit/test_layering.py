"""The layering, frozen for every top-level package: a new import that crosses a line fails here, naming the file
and the import. Each package may import itself and the project packages its row names (LAYERS), no other:

shared/        the contracts between processes: imports no other package (no service, engine, runner,
               simulator or benchmark)
engines/       imports shared/ only
services/<x>   imports shared/ and engines/ only: never another service, the runner (cluster/) or benchmarks
simulator/     imports shared/ only: no runner, service, engine or benchmark. It models runs and is validated
               on a real run's records, taken as data (simulator/validation.py); the benchmarks that run the
               cluster for it do so themselves (benchmarks/measured_cluster.py)
cluster/       the runner and the relay-rl command: imports shared/ only. It starts the services as processes
               by module name (`python -m services.<x>`), never imports one; it names a benchmark module only in
               its catalog (cluster/bench_catalog.py, what `relay-rl bench` runs) and never a liar: a test or a
               benchmark hands it the liar's entry point (ClusterOptions.worker_entry_points,
               benchmarks/liar_worker.py liar_entry_points)
deploy/        the chart's scripts: cluster/ and shared/
benchmarks/    every package but tests/ and deploy/: it measures them all; only tests/ imports it
tests/         every package but deploy/ (its scripts run as files)
liars          the trust tests' lying workers live in benchmarks/ (liars.py, liar_worker.py, lying_parents.py): no
               service, contract, engine, runner or simulator module imports them, names them or reads their
               RL_FAULT_* switches, so a production worker cannot be made to lie
vLLM           imported by the vLLM engine alone: engines/vllm_engine.py, its continuous batch
               (engines/vllm_continuous.py) and the sampler hook it installs into vLLM's own worker
               (engines/vllm_keyed_sampler.py); benchmarks/gpu.py also times bare
               vLLM as its baseline
A new top-level folder of Python files fails here until it has a row.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import re
from pathlib import Path

import pytest

# the code: the packages the vLLM and weight-channel rules scan
PROJECT_PACKAGES = ("shared", "services", "engines", "cluster", "simulator", "benchmarks")
# package -> the other project packages it may import (module docstring)
LAYERS: dict[str, set[str]] = {
    "shared": set(),
    "engines": {"shared"},
    "services": {"shared", "engines"},
    "simulator": {"shared"},
    "cluster": {"shared"},
    "deploy": {"shared", "cluster"},
    "benchmarks": {"shared", "engines", "services", "simulator", "cluster"},
    "tests": {"shared", "engines", "services", "simulator", "cluster", "benchmarks"},
}
VLLM_IMPORTERS = {
    "engines/vllm_engine.py",
    "engines/vllm_continuous.py",
    "engines/vllm_keyed_sampler.py",
    "benchmarks/gpu.py",
}
WEIGHT_CHANNEL = "shared.weight_channel"
CHUNK_PROTOCOL = {f"{WEIGHT_CHANNEL}.protocol", f"{WEIGHT_CHANNEL}.server", f"{WEIGHT_CHANNEL}.client"}
PRODUCTION_PACKAGES = ("services", "shared", "engines", "cluster", "simulator")
LIAR_MODULES = {"benchmarks.liars", "benchmarks.liar_worker", "benchmarks.lying_parents"}
LIAR_NAME = re.compile(r"\b(?:" + "|".join(re.escape(module) for module in sorted(LIAR_MODULES)) + r")\b")
BENCHMARK_MODULE = re.compile(r"\bbenchmarks(?:\.\w+)+")
BENCH_CATALOG = "cluster/bench_catalog.py"  # the one runner module that names benchmarks: `relay-rl bench NAME`


def _imports(path: Path) -> list[str]:
    """Absolute module names `path` imports (relative imports stay inside their package)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _imported_names(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from module import name` (absolute) in `path`; (module, "") for `import module`."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.module, alias.name) for alias in node.names)
    return found


def _crossings(repo_root: Path, package: str, allowed: set[str]) -> list[str]:
    """`file: import` for every import of a project package not in `allowed` from `package`'s files."""
    found = []
    for path in sorted((repo_root / package).rglob("*.py")):
        relative = path.relative_to(repo_root)
        own = relative.parts[1] if package == "services" and len(relative.parts) > 2 else None
        for name in _imports(path):
            top, *rest = name.split(".")
            if top not in LAYERS or top in allowed:
                continue
            if top == package and (own is None or (rest and rest[0] == own)):
                continue
            found.append(f"{relative}: import {name}")
    return found


def _top_level_folders(repo_root: Path) -> set[str]:
    """The tree's top-level folders that hold Python files (not hidden, not what .gitignore keeps out: build/)."""
    ignored = [
        line.strip().strip("/")
        for line in (repo_root / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return {
        entry.name
        for entry in repo_root.iterdir()
        if entry.is_dir()
        and not entry.name.startswith(".")
        and not any(fnmatch.fnmatch(entry.name, pattern) for pattern in ignored)
        and next(entry.rglob("*.py"), None) is not None
    }


def test_every_top_level_package_has_a_layer(repo_root: Path) -> None:
    assert _top_level_folders(repo_root) == set(LAYERS)
    assert set(PROJECT_PACKAGES) <= set(LAYERS)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_layer_imports_only_what_is_below_it(repo_root: Path, package: str) -> None:
    assert _crossings(repo_root, package, LAYERS[package]) == []


def _benchmark_names(repo_root: Path) -> list[str]:
    """`file: name` for every benchmark module a runner file (cluster/) names, its catalog aside."""
    found: list[str] = []
    for path in sorted((repo_root / "cluster").rglob("*.py")):
        relative = path.relative_to(repo_root).as_posix()
        if relative != BENCH_CATALOG:
            found.extend(f"{relative}: {name}" for name in BENCHMARK_MODULE.findall(path.read_text()))
    return found


def test_the_runner_names_no_benchmark_but_in_its_catalog(repo_root: Path) -> None:
    """Liars are started by a benchmark or a test through ClusterOptions.worker_entry_points, not by the runner."""
    assert _benchmark_names(repo_root) == []


def _liar_uses(repo_root: Path) -> list[str]:
    """`file: what` for every production file that imports a liar module, names one or names a fault switch."""
    found: list[str] = []
    for package in PRODUCTION_PACKAGES:
        for path in sorted((repo_root / package).rglob("*.py")):
            relative = path.relative_to(repo_root).as_posix()
            imported = [name for name in _imports(path) if name in LIAR_MODULES]
            found.extend(f"{relative}: import {name}" for name in imported)
            text = path.read_text()
            found.extend(f"{relative}: {name}" for name in LIAR_NAME.findall(text) if name not in imported)
            if "RL_FAULT_" in text:
                found.append(f"{relative}: RL_FAULT_")
    return found


def test_no_production_code_can_lie(repo_root: Path) -> None:
    assert _liar_uses(repo_root) == []


def test_only_the_vllm_engine_imports_vllm(repo_root: Path) -> None:
    importers = {
        path.relative_to(repo_root).as_posix()
        for package in PROJECT_PACKAGES
        for path in (repo_root / package).rglob("*.py")
        if any(name.split(".")[0] == "vllm" for name in _imports(path))
    }
    assert importers <= VLLM_IMPORTERS
    assert "engines/vllm_engine.py" in importers


def _project_files(repo_root: Path) -> list[Path]:
    return sorted(path for package in PROJECT_PACKAGES for path in (repo_root / package).rglob("*.py"))


def _outside_the_weight_channel(repo_root: Path, path: Path) -> bool:
    return not path.relative_to(repo_root).as_posix().startswith(WEIGHT_CHANNEL.replace(".", "/") + "/")


def _weight_channel_misuses(repo_root: Path) -> list[str]:
    """`file: import` for every import of the weight channel that breaks its rule (module docstring)."""
    public = set(importlib.import_module(WEIGHT_CHANNEL).__all__)
    found = []
    for path in _project_files(repo_root):
        if not _outside_the_weight_channel(repo_root, path):
            continue
        relative = path.relative_to(repo_root).as_posix()
        for module, name in _imported_names(path):
            if module == WEIGHT_CHANNEL:  # allowed: a name the package offers (not a submodule, not the package)
                allowed = name in public
            elif module.startswith(WEIGHT_CHANNEL + "."):  # a submodule: benchmarks only
                allowed = relative.startswith("benchmarks/") and module not in CHUNK_PROTOCOL
            else:
                continue
            if not allowed:
                found.append(f"{relative}: from {module} import {name}" if name else f"{relative}: import {module}")
    return found


def test_only_the_weight_channel_speaks_the_chunk_protocol(repo_root: Path) -> None:
    importers = {
        path.relative_to(repo_root).as_posix()
        for path in _project_files(repo_root)
        if _outside_the_weight_channel(repo_root, path) and CHUNK_PROTOCOL & set(_imports(path))
    }
    assert importers == set()


def test_the_weight_channel_is_used_through_its_public_names(repo_root: Path) -> None:
    assert _weight_channel_misuses(repo_root) == []


def test_shared_imports_no_torch_when_imported(repo_root: Path) -> None:
    """The coordinator and the reward service run without torch, and import only shared/ of what needs it. Only
    imports at a module's top level count: a function may import torch when it runs (weight_channel/layout.py).
    The tensor half of keyed sampling lives beside the engines (engines/keyed_tensors.py)."""
    importers = []
    for path in sorted((repo_root / "shared").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "torch" for name in names):
                importers.append(str(path.relative_to(repo_root)))
    assert importers == []


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The rule can fail: a service importing another service is reported."""
    (tmp_path / "services" / "learner").mkdir(parents=True)
    (tmp_path / "services" / "learner" / "loop.py").write_text(
        "from services.reward.service import X\nimport shared.bus\n"
    )
    assert _crossings(tmp_path, "services", {"shared", "engines"}) == [
        "services/learner/loop.py: import services.reward.service"
    ]


def test_the_checker_sees_the_simulator_import_a_runner(tmp_path: Path) -> None:
    """The rule can fail: the simulator starting a cluster itself is reported."""
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator" / "validation.py").write_text(
        "from cluster.local import LocalCluster\nfrom shared.config import RunConfig\n"
    )
    assert _crossings(tmp_path, "simulator", LAYERS["simulator"]) == ["simulator/validation.py: import cluster.local"]


def test_the_checker_sees_a_new_top_level_package(tmp_path: Path) -> None:
    """The rule can fail: a folder of Python files with no row; an ignored build/ and a folder of data are not one."""
    (tmp_path / ".gitignore").write_text("build/\n")
    for folder in ("shared", "tools", "build/lib/shared", "configs"):
        (tmp_path / folder).mkdir(parents=True)
    for path in ("shared/bus.py", "tools/sweep.py", "build/lib/shared/bus.py", "configs/demo.toml"):
        (tmp_path / path).write_text("")
    assert _top_level_folders(tmp_path) == {"shared", "tools"}


def test_the_checker_sees_a_liar_in_production(tmp_path: Path) -> None:
    """The rule can fail: a worker importing the lying engine, a contract naming the fault switch, the runner
    starting the liar's module by name."""
    for package in PRODUCTION_PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "services" / "worker.py").write_text("from benchmarks.liars import LyingEngine\n")
    (tmp_path / "shared" / "env.py").write_text('KIND = "RL_FAULT_INJECT"\n')
    (tmp_path / "cluster" / "local.py").write_text('launch(name, "benchmarks.liar_worker", env)\n')
    assert _liar_uses(tmp_path) == [
        "services/worker.py: import benchmarks.liars",
        "shared/env.py: RL_FAULT_",
        "cluster/local.py: benchmarks.liar_worker",
    ]


def test_the_checker_sees_the_runner_name_a_benchmark(tmp_path: Path) -> None:
    """The rule can fail: a runner module naming a benchmark module; the catalog may, and a path is not a name."""
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "local.py").write_text('module = "benchmarks.trust"  # see benchmarks/results/\n')
    (tmp_path / BENCH_CATALOG).write_text('TRUST = "benchmarks.trust"\n')
    assert _benchmark_names(tmp_path) == ["cluster/local.py: benchmarks.trust"]


def test_the_checker_sees_a_weight_channel_misuse(tmp_path: Path) -> None:
    """The rule can fail: a service reaching into the store, a submodule imported as a name, the protocol."""
    (tmp_path / "services" / "rollout").mkdir(parents=True)
    (tmp_path / "services" / "rollout" / "relay.py").write_text(
        "from shared.weight_channel import ChunkStore, store\n"
        "from shared.weight_channel.store import ReceivedBytes\n"
        "from shared.weight_channel.client import ChunkStream\n"
    )
    assert _weight_channel_misuses(tmp_path) == [
        "services/rollout/relay.py: from shared.weight_channel import store",
        "services/rollout/relay.py: from shared.weight_channel.store import ReceivedBytes",
        "services/rollout/relay.py: from shared.weight_channel.client import ChunkStream",
    ]
