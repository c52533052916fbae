"""report.json is one typed model (cluster/run_report.py): the report the runner writes reads back equal, a key
the model does not know is refused (a renamed field cannot read as missing), and the older reports committed
under benchmarks/results/ still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from cluster.report import write_report
from cluster.run_report import load_report
from shared.config import RunConfig
from shared.run_records import EvalRecord, StepRecord
from tests.run_records import eval_record, step_record

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMMITTED_REPORTS = sorted(RESULTS.rglob("*report.json"))  # demo_report.json, smollm2/full_s0/report.json, ...


def write_run(run_dir: Path) -> None:
    lines: list[StepRecord | EvalRecord] = [
        step_record(step, staleness_histogram={"0": 6, "1": 2}) for step in (1, 2, 3)
    ]
    lines += [eval_record(0, 0.1), eval_record(3, 0.4)]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(record.model_dump_json() + "\n" for record in lines))


def test_the_written_report_reads_back_as_it_was_written(tmp_path: Path) -> None:
    write_run(tmp_path)
    written = write_report(tmp_path, RunConfig(run_id="r"), None, wall_s=12.34)
    report = load_report(tmp_path / "report.json")
    assert report == written
    assert (report.num_steps, report.wall_s, report.eval_accuracy_after) == (3, 12.3, 0.4)
    assert report.staleness_histogram == {"0": 18, "1": 6} and report.max_trained_staleness == 1
    assert report.plots and all((tmp_path / name).exists() for name in report.plots)
    assert "date" not in json.loads((tmp_path / "report.json").read_text())  # only a committed copy is dated


def test_the_committed_reports_are_found() -> None:
    assert len(COMMITTED_REPORTS) >= 6


def test_a_key_the_model_does_not_know_is_refused(tmp_path: Path) -> None:
    write_run(tmp_path)
    write_report(tmp_path, RunConfig(run_id="r"), None, wall_s=1.0)
    raw = json.loads((tmp_path / "report.json").read_text())
    raw["reward_mean_last_10"] = raw.pop("reward_mean_last10")  # a renamed field
    (tmp_path / "renamed.json").write_text(json.dumps(raw))
    with pytest.raises(ValidationError, match="reward_mean_last"):
        load_report(tmp_path / "renamed.json")


@pytest.mark.parametrize("path", COMMITTED_REPORTS, ids=lambda path: path.relative_to(RESULTS).as_posix())
def test_the_committed_reports_still_load(path: Path) -> None:
    report = load_report(path)
    raw = json.loads(path.read_text())
    assert report.reward_mean_last10 == raw["reward_mean_last10"] and report.date == raw.get("date")
    assert (report.zero_variance is None) == ("zero_variance" not in raw)  # the section came later
    assert report.accounting is not None and report.accounting.num_trained == raw["accounting"]["num_trained"]
