"""docs/results.md is generated from benchmarks/results/*.json (benchmarks/results_page.py): a figure on the
page cannot drift from its file, and every result file has its place on the page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import results_page


def test_the_page_is_what_the_result_files_give(repo_root: Path) -> None:
    assert (repo_root / "docs" / "results.md").read_text() == results_page.render(), "run `make results-page`"


def test_every_result_file_is_on_the_page() -> None:
    assert results_page.unlisted() == []


def test_a_changed_figure_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    before = results_page.render()
    real_load = results_page.load

    def load(name: str) -> dict[str, Any]:
        data = real_load(name)
        return {**data, "reward_mean_last10": 0.123456} if name == "demo_report.json" else data

    monkeypatch.setattr(results_page, "load", load)
    after = results_page.render()
    assert after != before and "| mean train reward, last 10 steps | 0.123456 |" in after


def test_a_result_without_date_or_command_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real_load = results_page.load
    monkeypatch.setattr(
        results_page,
        "load",
        lambda name: (
            {k: v for k, v in real_load(name).items() if k != "date"} if name == "trust.json" else real_load(name)
        ),
    )
    with pytest.raises(ValueError, match="trust.json: no date"):
        results_page.render()
    assert json.loads((results_page.RESULTS_DIR / "trust.json").read_text())["date"]
