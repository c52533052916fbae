"""The wheels a lent GPU machine lacks for `make gpu-check`, and the check that nothing else is missing.

    python -m benchmarks.gpu_wheels --dest .whl       # here (needs PyPI): `make gpu-wheels`
    python -m benchmarks.gpu_wheels --check .whl      # which imports of the check's code paths nothing provides

The lent machine (docs/gpu_check.md) has Python 3.12 with torch (CUDA), transformers, safetensors, msgpack,
httpx and peft, and no network. Everything else the check's processes import travels with the working tree
as wheels in .whl/ (git-ignored; the device call names it in `carry`) and is installed there with
`pip install --no-index --no-deps --target`.

Which wheels: the transitive requirements (markers evaluated for CPython 3.12 on x86-64 Linux) of this
repository's dependencies on the check's path, minus MACHINE_PACKAGES (except those a shipped package needs
at a minimum version: typing-extensions, anyio, h11), each at the version this checkout's .venv runs, as
cp312 manylinux x86-64 (or pure-Python) wheels. The requirement graph is read from the
installed metadata here, so it is the graph of the versions tested here.

The check walks the repository's modules reachable from the check's entry points (every `import`, at module
level or deferred inside a function) and lists each third-party top-level module that is neither in the
standard library, nor provided by the machine's packages, nor by a wheel in the folder. A deferred import on a
branch the check never takes (vLLM: the check's engine is torch) is allowed by name in OFF_PATH.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parent.parent
REPO_PACKAGES = ("benchmarks", "cluster", "engines", "services", "shared", "simulator", "tests")
# What the lent machine has installed besides the standard library: the six packages it was set up with
# and the requirements they have had for years. Not computed from this .venv's metadata: newer versions
# here pull more (huggingface_hub 2 pulls pydantic and click), which the machine's older ones may not.
MACHINE_PACKAGES = (
    *("torch", "transformers", "safetensors", "msgpack", "httpx", "peft"),
    *("filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec"),  # torch
    *("huggingface-hub", "numpy", "packaging", "pyyaml", "regex", "tokenizers", "tqdm"),  # transformers
    *("anyio", "certifi", "httpcore", "h11", "idna", "sniffio"),  # httpx
    *("accelerate", "psutil"),  # peft
)
# Requirements of pyproject's dependencies that the check's processes never import, and why
OFF_PATH_PACKAGES = {
    "pokerkit": "the kuhn_poker task's game engine; the check trains arithmetic_mod10",
    "rich": "relay-rl's progress bars (cluster/cli.py); the check drives cluster.local.LocalCluster itself",
    "httptools": "uvicorn's C HTTP parser: optional, uvicorn falls back to h11",
    "uvloop": "uvicorn's event loop: optional, uvicorn falls back to asyncio",
}
# Deferred imports (inside a function) on branches the check never takes
OFF_PATH = {
    "vllm": "engines/vllm_engine.py: the check's engine is torch",
    "matplotlib": "cluster/report.py plot(): the check summarizes without plots",
    "rich": "cluster/status_view.py, demo_progress.py: the CLI's progress views",
    "pokerkit": "shared/tasks/poker.py: the kuhn_poker task",
    "reasoning_gym": "shared/tasks/logic.py, math_gym.py: the logic and math_gym tasks",
    "math_verify": "shared/tasks/math_answers.py: the math tasks",
    "datasets": "shared/tasks/math_file.py: the math_file task",
}
# The modules every process of the check starts from (cluster.local starts the services as `python -m`)
ENTRY_MODULES = (
    "benchmarks.gpu_check",
    "benchmarks.gpu_check_parts",
    "cluster.local",
    "cluster.report",
    "services.coordinator.__main__",
    "services.reward.__main__",
    "services.learner.__main__",
    "services.learner.model_init",
    "services.rollout.__main__",
)
TARGET_ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def requirement_closure(roots: Iterable[Requirement], stop: Iterable[str] = ()) -> set[str]:
    """Canonical names of `roots` and everything they require on the target, as installed here; a package
    in `stop` is neither counted nor followed (the machine has it, with what it needs)."""
    seen: set[str] = set()
    stopped = {canonicalize_name(name) for name in stop}
    pending = list(roots)
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or name in stopped:
            continue
        seen.add(name)
        try:
            texts = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:  # required but not installed: nothing below it is known
            continue
        for text in texts:
            child = Requirement(text)
            if child.marker is None or marker_holds(child.marker, requirement.extras):
                pending.append(child)
    return seen


def marker_holds(marker: Marker, extras: set[str]) -> bool:
    """The marker on the target (TARGET_ENVIRONMENT), for the parent's extras (or none)."""
    return any(marker.evaluate(TARGET_ENVIRONMENT | {"extra": extra}) for extra in (extras or {""}))


def repo_requirements() -> list[Requirement]:
    """pyproject's [project] dependencies that the check's processes import (OFF_PATH_PACKAGES left out)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(text) for text in project["dependencies"]]
    return [r for r in requirements if canonicalize_name(r.name) not in OFF_PATH_PACKAGES]


def wheels_to_ship() -> dict[str, str]:
    """Canonical name -> the version installed here, of every package the machine lacks."""
    needed = requirement_closure(repo_requirements(), stop=MACHINE_PACKAGES)
    needed |= floored_machine_packages(needed)
    return {name: importlib.metadata.version(name) for name in sorted(needed)}


def floored_machine_packages(shipped: Iterable[str]) -> set[str]:
    """Machine packages that a shipped one requires at a minimum version: they travel too, at the version
    tested here, since the machine's may be older (pydantic 2.14 needs typing-extensions >= 4.16; a Python
    set up for an older torch can predate it). Shadowing the machine's copy is safe: newer is compatible."""
    machine = {canonicalize_name(name) for name in MACHINE_PACKAGES}
    floored: set[str] = set()
    for name in shipped:
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not marker_holds(requirement.marker, set()):
                continue
            has_floor = any(spec.operator in (">=", ">", "==", "~=") for spec in requirement.specifier)
            if canonicalize_name(requirement.name) in machine and has_floor:
                floored.add(canonicalize_name(requirement.name))
    return floored


def download(dest: Path) -> list[Path]:
    """pip download of `wheels_to_ship()` into `dest`: binary wheels for cp312 x86-64 Linux, no dependencies
    resolved by pip (the list is already closed). Writes dest/wheels.txt (name==version per line)."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version}" for name, version in wheels_to_ship().items()]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3"]
    command += ["--abi", "none", *(arg for platform in PLATFORMS for arg in ("--platform", platform))]
    subprocess.run([*command, "--dest", str(dest), *pins], check=True)
    (dest / "wheels.txt").write_text("\n".join(pins) + "\n")
    return sorted(dest.glob("*.whl"))


# the import check
@dataclass(frozen=True)
class ImportSite:
    module: str  # top-level name, e.g. "fastapi"
    where: str  # repository module that imports it
    deferred: bool  # inside a function: imported only when that code runs


def third_party_imports(entry_modules: Iterable[str] = ENTRY_MODULES) -> list[ImportSite]:
    """Every third-party top-level import of the repository modules reachable from `entry_modules`."""
    sites: set[ImportSite] = set()
    seen: set[str] = set()
    pending = list(entry_modules)
    while pending:
        module = pending.pop()
        path = module_path(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        for name, deferred in imported_names(path, module):
            top = name.split(".")[0]
            if top in REPO_PACKAGES:
                pending += [name, *parent_packages(name)]
            elif top not in sys.stdlib_module_names and top != "__future__":
                sites.add(ImportSite(top, module, deferred))
    return sorted(sites, key=lambda site: (site.module, site.where, site.deferred))


def module_path(module: str) -> Path | None:
    base = REPO_ROOT / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None  # a name imported from a module (`from shared.config import RunConfig`), not a module


def parent_packages(module: str) -> list[str]:
    """`a.b.c` -> [`a.b`, `a`]: importing a module runs its packages' __init__ first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def imported_names(path: Path, module: str) -> list[tuple[str, bool]]:
    """(module name, deferred) for every import in the file; `from a import b` yields a.b and a (b may be a
    module); relative imports resolved against `module`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {  # under `if TYPE_CHECKING:`: never imported at run time
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for statement in block.body
        for node in ast.walk(statement)
    }
    deferred_nodes = {
        id(node)
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
    }
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        deferred = id(node) in deferred_nodes
        if isinstance(node, ast.Import):
            names += [(alias.name, deferred) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.append((base, deferred))
            names += [(f"{base}.{alias.name}", deferred) for alias in node.names]
    return [(name, deferred) for name, deferred in names if name]


def top_level_modules(files: Iterable[str]) -> set[str]:
    """Top-level importable names among a distribution's (or wheel's) file paths."""
    names = set()
    for file in files:
        first = file.split("/")[0]
        if first.endswith((".dist-info", ".data")) or first in ("..", "__pycache__") or "-" in first:
            continue
        if "/" in file or first.endswith((".py", ".so", ".pyd")):
            names.add(first.split(".")[0])
    return names


def machine_modules() -> set[str]:
    """Top-level modules of the machine's packages and their requirements (as installed here)."""
    modules: set[str] = set()
    for name in MACHINE_PACKAGES:
        try:
            modules |= top_level_modules(str(file) for file in importlib.metadata.files(name) or [])
        except importlib.metadata.PackageNotFoundError:  # not installed here: its usual import name
            modules.add(canonicalize_name(name).replace("-", "_"))
    return modules


def wheel_modules(wheel_dir: Path) -> set[str]:
    modules: set[str] = set()
    for wheel in wheel_dir.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            modules |= top_level_modules(archive.namelist())
    return modules


def missing_imports(wheel_dir: Path) -> list[ImportSite]:
    """Imports that neither the machine nor the wheels provide (deferred ones in OFF_PATH allowed)."""
    available = machine_modules() | wheel_modules(wheel_dir)
    return [
        site
        for site in third_party_imports()
        if site.module not in available and not (site.deferred and site.module in OFF_PATH)
    ]


def not_importable() -> list[str]:
    """The check's required third-party modules that this interpreter cannot find (on the lent machine,
    after the wheels are installed: the real test of the lists above)."""
    required = {site.module for site in third_party_imports() if not (site.deferred and site.module in OFF_PATH)}
    return sorted(module for module in required if importlib.util.find_spec(module) is None)


def check_report(wheel_dir: Path) -> str:
    missing = missing_imports(wheel_dir)
    if not missing:
        num_wheels = len(list(wheel_dir.glob("*.whl")))
        return f"every import of the check's code paths is on the lent machine or among the {num_wheels} wheels in {wheel_dir}"
    importers: dict[str, list[str]] = {}
    for site in missing:
        importers.setdefault(site.module, []).append(site.where + (" (deferred)" if site.deferred else ""))
    lines = [
        f"  {module}: imported by {', '.join(sorted(where)[:3])}"
        + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        for module, where in sorted(importers.items())
    ]
    return "missing on the lent machine (neither preinstalled nor a wheel):\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, help="download the wheels into this folder (e.g. .whl)")
    parser.add_argument("--check", type=Path, help="list the imports this wheel folder leaves missing")
    args = parser.parse_args()
    if args.dest is None and args.check is None:
        parser.error("give --dest DIR (download) or --check DIR")
    if args.dest is not None:
        wheels = download(args.dest)
        total_bytes = sum(wheel.stat().st_size for wheel in wheels)
        for wheel in wheels:
            print(f"  {wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
        print(f"{len(wheels)} wheels, {total_bytes / 2**20:.1f} MiB in {args.dest}")
    if args.check is not None:
        print(check_report(args.check))
        if missing_imports(args.check):
            sys.exit(1)


if __name__ == "__main__":
    main()
