"""Writing a benchmark's result file: JSON, dated (the results page, benchmarks/results_page.py, shows each
file's command and date as the file records them)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def write_result(path: Path, result: dict[str, Any]) -> None:
    """`result` as indented JSON at `path`, with today's UTC date first unless it records its own."""
    dated = {"date": time.strftime("%Y-%m-%d", time.gmtime()), **result}
    path.write_text(json.dumps(dated, indent=2) + "\n")
