"""Running one engine's measurement in a subprocess under the interpreter that has that engine (vLLM lives
in .venv-vllm-cpu, docs/engines.md): the benchmarks that compare engines each run `python -m <module>
--child ...`, which prints its result as one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any


def run_engine_child(python: str, module: str, child_args: list[str], timeout_s: float) -> dict[str, Any]:
    """`python -m module --child *child_args`: the last JSON object it printed, or {"error": the last line of
    its stderr that names an error} when it failed or printed none."""
    command = [python, "-m", module, "--child", *child_args]
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}  # this checkout's code, whichever venv runs it
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        last_error = [line for line in done.stderr.strip().splitlines() if "Error" in line][-1:]
        return {"error": (last_error or [f"exit {done.returncode}"])[0][:300]}
    return dict(json.loads(lines[-1]))
