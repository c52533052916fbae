"""The run report's supervision and accounting sections, and the progress line's restart count, from
the typed records the runner writes (supervision.json, accounting.json)."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.accounting import GroupAccounting
from cluster.local import restarts_text
from cluster.report import build_report, read_accounting
from cluster.run_report import load_report, save_report
from cluster.supervisor import RestartMode, ServiceRecord, ServiceRestarts, ServiceState, SupervisionRecord
from shared.config import RunConfig


def supervision() -> SupervisionRecord:
    return SupervisionRecord(
        services={
            "redis": ServiceRecord(restart_policy=RestartMode.UNLESS_STOPPED, state=ServiceState.STOPPED),
            "worker-0": ServiceRecord(
                restart_policy=RestartMode.UNLESS_STOPPED,
                state=ServiceState.GAVE_UP,
                num_restarts=2,
                crash_exit_codes=[-9, 1, 1],
                gave_up=True,
            ),
            "learner": ServiceRecord(
                restart_policy=RestartMode.ON_FAILURE, state=ServiceState.STOPPED, num_restarts=1, crash_exit_codes=[-9]
            ),
        }
    )


def test_restarts_reach_the_report_and_the_progress_line(tmp_path: Path) -> None:
    (tmp_path / "supervision.json").write_text(supervision().model_dump_json())
    report = build_report(tmp_path, RunConfig(), None, 1.0, [], [])
    assert report.num_restarts == 3
    assert report.restarts["worker-0"] == ServiceRestarts(num_restarts=2, crash_exit_codes=[-9, 1, 1], gave_up=True)
    assert report.gave_up_on == ["worker-0"]
    assert restarts_text(supervision()) == "restarts 3 (worker-0 2, learner 1) | gave up on worker-0"
    nothing = build_report(tmp_path / "none", RunConfig(), None, 1.0, [], [])
    assert (nothing.num_restarts, nothing.restarts, nothing.gave_up_on) == (0, {}, [])


def test_the_accounting_section_names_groups_nobody_can_account_for(tmp_path: Path) -> None:
    assert read_accounting(tmp_path) is None
    accounting = GroupAccounting(
        num_tasks_issued=104,
        num_produced=100,
        num_dead_lettered_work=1,
        num_unleased=2,
        num_held=1,
        num_scored=97,
        num_trained=80,
        num_dropped={"stale": 10},
        num_dead_lettered_reward=2,
        num_dead_lettered_learner=1,
        num_pending_reward=1,
        num_pending_learner=5,
    )
    (tmp_path / "accounting.json").write_text(accounting.model_dump_json())
    report = build_report(tmp_path, RunConfig(), None, 1.0, [], [])
    save_report(tmp_path / "report.json", report)
    written = json.loads((tmp_path / "report.json").read_text())["accounting"]
    assert (written["num_accounted"], written["num_unaccounted"]) == (103, 1)  # the totals are in the file
    section = load_report(tmp_path / "report.json").accounting  # and computed again on reading
    assert section is not None and section == accounting
    assert (section.num_accounted, section.num_unaccounted) == (103, 1)  # one group lost
    assert section.unaccounted_by_stage == {"tasks": 0, "rollouts": 0, "scored": 1}  # between reward and learner
