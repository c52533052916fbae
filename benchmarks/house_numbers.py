"""The house's numbers (issue 38's before/after), counted from a checkout:

    python -m benchmarks.house_numbers [CHECKOUT]       (default: this repository)

docs pages and lines; dates (YYYY-MM-DD) on docs pages other than the results page, where figures live; production
functions (services, shared, engines, cluster, simulator) longer than 60 lines, argument parsers included; direct
environment reads (os.environ.get, os.getenv, os.environ[...]) and the RL_* names in production code.
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
ENV_READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[")
RL_NAME = re.compile(r"\bRL_[A-Z0-9_]+")


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


def count(root: Path) -> dict[str, object]:
    docs = sorted((root / "docs").glob("*.md"))
    production = [p.read_text() for package in PRODUCTION_PACKAGES for p in (root / package).rglob("*.py")]
    return {
        "docs_pages": len(docs),
        "docs_lines": sum(len(page.read_text().splitlines()) for page in docs),
        "dates_outside_results_page": sum(len(DATE.findall(p.read_text())) for p in docs if p.name != "results.md"),
        "functions_over_60_lines": long_functions(root),
        "direct_env_reads": sum(len(ENV_READ.findall(source)) for source in production),
        "rl_names": len({name for source in production for name in RL_NAME.findall(source)}),
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
