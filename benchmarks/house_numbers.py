"""The house's numbers (issue 38's before/after), counted from a checkout:

    python -m benchmarks.house_numbers [CHECKOUT]       (default: this repository)

docs pages and lines; dates (YYYY-MM-DD) on docs pages other than the results page, where figures live; production
functions (services, shared, engines, cluster, simulator) longer than 60 lines, argument parsers included; direct
environment reads (os.environ.get, os.getenv, os.environ[...] not assigned to) and the RL_* names in
production code (written out, or read by a settings class); the run file's settings (fields of shared/config.py's sections).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_PACKAGES = ("services", "shared", "engines", "cluster", "simulator")
MAX_FUNCTION_LINES = 60
DATE = re.compile(r"20\d\d-\d\d-\d\d")
ENV_READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^]]+\](?!\s*=[^=])")  # a write is no read
RL_NAME = re.compile(r"\bRL_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")  # a name, not a prefix ("RL_COORDINATOR_")


def long_functions(root: Path) -> list[tuple[int, str]]:
    """(lines, "path:name") of every production function over MAX_FUNCTION_LINES, longest first."""
    found = []
    for path in sorted(p for package in PRODUCTION_PACKAGES for p in (root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                num_lines = node.end_lineno - node.lineno + 1
                if num_lines > MAX_FUNCTION_LINES:
                    found.append((num_lines, f"{path.relative_to(root)}:{node.name}"))
    return sorted(found, reverse=True)


def run_file_fields(root: Path) -> int:
    """The run file's settings: the fields of every section model in shared/config.py, plus RunConfig's own
    scalars (run_id), read from the source so any checkout counts the same way."""
    tree = ast.parse((root / "shared" / "config.py").read_text())
    sections = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    total = 0
    for name, node in sections.items():
        fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        fields = [s for s in fields if s.target.id != "model_config"]  # type: ignore[union-attr]
        if name == "RunConfig":
            total += sum(ast.unparse(s.annotation) not in sections for s in fields)
        elif any(isinstance(base, ast.Name) and base.id == "Section" for base in node.bases):
            total += len(fields)
    return total


def settings_variables(root: Path) -> set[str]:
    """The RL_* variables the production settings classes read (pydantic-settings: each field's alias, else the
    class's env_prefix + its name), subclasses included; with the names written out in code, every RL_* name."""
    classes = [
        node
        for package in PRODUCTION_PACKAGES
        for path in (root / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    prefixes: dict[str, str] = {"BaseSettings": ""}  # settings class -> its env_prefix
    names: set[str] = set()
    grew = True
    while grew:  # parents first, whatever the file order
        grew = False
        for node in classes:
            parents = [base.id for base in node.bases if isinstance(base, ast.Name) and base.id in prefixes]
            if node.name in prefixes or not parents:
                continue
            prefixes[node.name] = _env_prefix(node, prefixes[parents[0]])
            grew = True
            for field in node.body:
                if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                    if field.target.id != "model_config" and not _has_alias(field):
                        names.add(f"{prefixes[node.name]}{field.target.id}".upper())
    return {name for name in names if name.startswith("RL_")}


def _env_prefix(node: ast.ClassDef, inherited: str) -> str:
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign | ast.Assign) and "env_prefix" in ast.unparse(statement):
            match = re.search(r"env_prefix=['\"]([^'\"]*)['\"]", ast.unparse(statement))
            if match:
                return match.group(1)
    return inherited


def _has_alias(field: ast.AnnAssign) -> bool:
    return field.value is not None and "validation_alias" in ast.unparse(field.value)


def count(root: Path) -> dict[str, object]:
    docs = sorted((root / "docs").glob("*.md"))
    production = [p.read_text() for package in PRODUCTION_PACKAGES for p in (root / package).rglob("*.py")]
    return {
        "docs_pages": len(docs),
        "docs_lines": sum(len(page.read_text().splitlines()) for page in docs),
        "dates_outside_results_page": sum(len(DATE.findall(p.read_text())) for p in docs if p.name != "results.md"),
        "functions_over_60_lines": long_functions(root),
        "run_file_fields": run_file_fields(root),
        "direct_env_reads": sum(len(ENV_READ.findall(source)) for source in production),
        "rl_names": len({name for source in production for name in RL_NAME.findall(source)} | settings_variables(root)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", nargs="?", type=Path, default=REPO_ROOT)
    numbers = count(parser.parse_args(argv).checkout)
    for name, value in numbers.items():
        if isinstance(value, list):
            print(f"{name}: {len(value)}")
            for num_lines, function in value:
                print(f"    {num_lines:4d} {function}")
        else:
            print(f"{name}: {value}")


if __name__ == "__main__":
    main()
