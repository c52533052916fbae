"""The source checkout, for the commands that need one.

The installed package holds the services, the engines and the CLI, which is all a worker needs:
`relay-rl worker --coordinator URL`, `status`, `drain`, `keys`, `model` and `operators` work from any
install (pip, the image). `relay-rl demo` (the run files in configs/, a runs/ folder beside them) and
`relay-rl bench` (benchmarks/, never packaged) run from a checkout of the repository, installed with
`pip install -e .` (what `make` does); from anywhere else they stop with one line saying so.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the checkout, for an editable install


def is_source_checkout(root: Path = PACKAGE_ROOT) -> bool:
    return (root / "pyproject.toml").is_file() and (root / "configs").is_dir() and (root / "benchmarks").is_dir()


def source_checkout(command: str, root: Path = PACKAGE_ROOT) -> Path:
    """The checkout's root; SystemExit with what to do where this install has none."""
    if not is_source_checkout(root):
        raise SystemExit(
            f"relay-rl {command} runs from a source checkout of relay-rl (configs/, benchmarks/), and this install "
            f"at {root} is not one: clone the repository and `pip install -e .` there (or run `make`). "
            "relay-rl worker, status, drain, keys, model and operators work from any install."
        )
    return root
