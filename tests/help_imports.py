"""`python -m MODULE ... --help` under `-X importtime`: what a --help answer prints and which top-level
packages it imported (to show that torch, vllm and the like stay out of it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def help_and_imports(argv: list[str], repo_root: Path) -> tuple[str, set[str]]:
    """Run `python -X importtime -m ARGV --help` from the repository root; assert that it answered with a
    usage text, and return that text with the top-level names of every module it imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", *argv, "--help"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower()
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    return result.stdout, imported
