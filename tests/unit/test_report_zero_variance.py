"""The run report's zero-variance section, from the StepRecords of metrics.jsonl (one FlatGroups each) and
the learner's last state: the share of flat groups, its split by reward, dynamic sampling's cost, and the
learner's warning; and an old metrics.jsonl line without the fields still reads."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.report import summarize_zero_variance
from shared.api import LearnerInfo, StatusResponse
from shared.config import GRPOConfig, RunConfig
from shared.messages import FlatGroups
from shared.run_records import StepRecord, read_metrics
from tests.run_records import step_record


def flat_step(step: int, flat: FlatGroups, warning: str | None = None) -> StepRecord:
    return step_record(
        step,
        staleness_histogram={"0": flat.num_trained},
        num_dropped={"zero_variance": 2 * step} if flat.num_skipped else {},
        num_groups=flat.num_trained,
        num_samples=4 * flat.num_trained,
        flat_groups=flat,
        zero_variance_warning=warning,
    )


def test_the_report_sums_flat_groups_over_the_run_and_keeps_the_learners_warning() -> None:
    flat = FlatGroups(num_groups=6, num_flat_at_zero=3, num_flat_at_max=1, num_skipped=2, num_samples=24)
    steps = [flat_step(1, flat), flat_step(2, flat, warning="zero reward variance: ..."), flat_step(3, flat)]
    run = RunConfig(grpo=GRPOConfig(dynamic_sampling=True))

    section = summarize_zero_variance(steps, run, status=None)

    assert section.zero_variance_fraction == round(4 / 6, 4)
    assert (section.num_flat_at_zero, section.num_flat_at_max, section.num_flat_other) == (9, 3, 0)
    assert (section.num_groups_looked_at, section.num_skipped) == (18, 6)
    assert section.groups_per_trained_group == 1.5  # 18 generated for 12 trained
    assert section.dynamic_sampling is True
    assert section.warned_at_steps == [2] and section.warning == "zero reward variance: ..."


def test_a_metrics_line_written_before_flat_groups_existed_still_reads(tmp_path: Path) -> None:
    record = flat_step(1, FlatGroups()).model_dump()
    del record["flat_groups"], record["zero_variance_warning"]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (step,), _ = read_metrics(tmp_path / "metrics.jsonl")
    assert step.flat_groups == FlatGroups() and step.zero_variance_warning is None
    section = summarize_zero_variance([step], RunConfig(), status=None)
    assert (section.zero_variance_fraction, section.num_skipped) == (None, 0)  # nothing was counted


def test_skips_of_a_batch_that_never_filled_count_from_the_learners_state() -> None:
    learner = LearnerInfo(
        status="done",
        learner_version=0,
        published_version=0,
        num_steps_target=20,
        num_dropped={"zero_variance": 576},
        last_reward_mean=0.0,
        busy_fraction=0.0,
        last_flat_groups=FlatGroups(num_groups=8, num_flat_at_zero=8, num_skipped=8, num_samples=32),
        zero_variance_warning="zero reward variance: ... the batch cannot fill.",
    )
    status = StatusResponse(
        run_id="r", staleness_bound=2, learner=learner, stream_depths={}, num_dead_letters=0, workers=[]
    )
    section = summarize_zero_variance([], RunConfig(grpo=GRPOConfig(dynamic_sampling=True)), status)
    assert section.num_skipped == 576 and section.zero_variance_fraction is None
    assert section.groups_per_trained_group is None  # nothing trained: no finite cost
    assert section.warning == "zero reward variance: ... the batch cannot fill."
