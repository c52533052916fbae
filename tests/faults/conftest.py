"""The fault suite's fixtures and its results table.

`fault_run(...)`: tests/faults/cluster_run.py's `run_with_fault` in this test's tmp_path, on the tiny policy
built once per session. With RL_FAULT_SUITE_RESULTS=<path> (`make test-faults` sets
benchmarks/results/fault_suite.json), every test's outcome, wall time and group accounting is merged into
that file at the end of the session (one row per test, keyed by its name; a partial run updates only its
own rows), so `make test-faults` reproduces the table.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.cluster_run import FaultRun, run_with_fault

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_ENV = "RL_FAULT_SUITE_RESULTS"  # where to write the table (unset: nowhere)
COMMAND_ENV = "RL_FAULT_SUITE_COMMAND"  # the command the table says produced it (default: make test-faults)

ROWS: dict[str, dict[str, Any]] = {}  # test name -> its row, in the order the tests ran

FaultRunner = Callable[..., FaultRun]


@pytest.fixture
def fault_run(request: pytest.FixtureRequest, tmp_path: Path, tiny_policy_dir: Path) -> FaultRunner:
    """Run the cluster with one fault (keyword arguments of run_with_fault); the run's row joins the table."""

    def run(**kwargs: Any) -> FaultRun:
        result = run_with_fault(tmp_path, tiny_policy_dir, **kwargs)
        ROWS.setdefault(request.node.name, {}).update(result.row)
        result.row = ROWS[request.node.name]  # a test adds its own columns (e.g. the liar's detection)
        return result

    return run


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" or (report.when == "setup" and report.failed):
        row = ROWS.setdefault(item.name, {})
        row["outcome"] = report.outcome
        row["test_wall_s"] = round(report.duration, 1)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    results = os.environ.get(RESULTS_ENV)
    if not ROWS or not results:
        return
    path = REPO_ROOT / results
    previous: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    suite = tests_in_suite()  # a row of a test since renamed or removed is dropped, never published again
    rows = {row["test"]: row for row in previous.get("tests", []) if row["test"].split("[")[0] in suite}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name, row in ROWS.items():
        rows[name] = {"test": name, "measured_at": stamp, "commit": commit(), **row}
    table = {
        "date": stamp[:10],
        "command": os.environ.get(COMMAND_ENV, "make test-faults"),
        "config": "tests/faults/faults.toml",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_at_end": os.getloadavg()},
        "num_tests": len(rows),
        "num_passed": sum(row.get("outcome") == "passed" for row in rows.values()),
        "total_test_wall_s": round(sum(row.get("test_wall_s", 0.0) for row in rows.values()), 1),
        "tests": list(rows.values()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=2) + "\n")


def tests_in_suite() -> set[str]:
    """The names of the fault suite's test functions now (parameters left out), read from its files."""
    return {
        match.group(1)
        for path in Path(__file__).parent.glob("test_*.py")
        for match in re.finditer(r"^def (test_\w+)\(", path.read_text(), flags=re.MULTILINE)
    }


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return result.stdout.strip()
