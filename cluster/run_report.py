"""runs/<run-id>/report.json, typed: `RunReport` is what cluster/report.py builds at the end of a run (the
runner writes it, cluster/local.py), and every reader (the runner's summary lines, benchmarks, tests) loads it
with `load_report` and reads attributes, so a renamed field fails under mypy instead of reading as missing.

    headline        steps, reward, wall and learner time, staleness, drops, evaluations, cost, workers
    time_use        where the time went and the verdict (shared/time_use.py), from the last status
    zero_variance   groups with zero reward variance over the run (ZeroVarianceSection)
    broadcast       bytes per version and T_bcast (BroadcastSection)
    restarts        the supervisor's restarts by service (cluster/supervisor.py: ServiceRestarts)
    accounting      every group produced (cluster/accounting.py: GroupAccounting, written with its totals)

Reports written before a section existed still load (the committed ones under benchmarks/results/ are older):
`zero_variance` is None when absent, `date` is the day a committed copy was measured (the runner writes
none), and the accounting of a report that predates `num_tasks_issued` reads it as 0, so its totals,
computed again on loading, do not add up (the file's own totals are in it, as written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from cluster.accounting import TOTALS, GroupAccounting
from cluster.supervisor import ServiceRestarts
from shared.api import WorkerState
from shared.messages import EvalRecord
from shared.time_use import TimeUse


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EvalPoint(Section):
    step: int = Field(description="the learner version evaluated")
    accuracy: float = Field(description="held-out greedy accuracy")
    format_rate: float | None = Field(None, description="answers in the task's answer form (None: no form, or older)")
    formatted_accuracy: float | None = Field(None, description="accuracy among the answers in that form")
    chance_accuracy: float | None = Field(None, description="what the answer form alone scores (chance baseline)")
    chance_strategy: str | None = None
    evaluated_by: str | None = Field(None, description='"learner" or "workers" (None: a report from before)')
    eval_s: float | None = Field(None, description="the evaluation's duration")

    @classmethod
    def of(cls, record: EvalRecord) -> EvalPoint:
        return cls(
            step=record.eval_step,
            accuracy=record.eval_accuracy,
            format_rate=record.eval_format_rate,
            formatted_accuracy=record.eval_formatted_accuracy,
            chance_accuracy=record.eval_chance_accuracy,
            chance_strategy=record.eval_chance_strategy,
            evaluated_by=record.evaluated_by,
            eval_s=round(record.eval_s, 2),
        )


class WorkerRow(Section):
    """A worker as the coordinator's last status saw it."""

    name: str
    policy_version: int
    state: WorkerState
    num_groups_done: int


class ZeroVarianceSection(Section):
    """Groups with zero reward variance (every sample scored the same: no gradient) over the run's steps, split
    by the reward they sit at; dynamic sampling's cost; the learner's warnings (docs/operations.md)."""

    zero_variance_fraction: float | None = Field(description="flat groups / groups looked at; None: none looked at")
    zero_variance_fraction_last10: float | None = Field(description="the same, mean over the last 10 steps")
    num_groups_looked_at: int
    num_flat_at_zero: int
    num_flat_at_max: int
    num_flat_other: int
    cut_fraction: float = Field(description="samples that stopped at max_new_tokens")
    dynamic_sampling: bool
    num_skipped: int = Field(description="flat groups dynamic sampling skipped, the whole run's")
    groups_per_trained_group: float | None = Field(description="dynamic sampling's cost; None: nothing trained")
    warned_at_steps: list[int]
    warning: str | None = Field(description="the learner's warning standing at the end, else its last one")


class BroadcastSection(Section):
    """Weight broadcast: bytes announced per version as a fraction of the full weights (the learner's
    broadcast.jsonl), measured T_bcast, its learner-publication share, and the rollout pause per swap."""

    num_versions: int
    num_delta_versions: int
    full_size_bytes: int | None
    delta_size_fraction_mean: float | None
    bytes_fraction_overall: float | None
    t_bcast_num_versions: int
    t_bcast_mean_s: float | None
    t_bcast_max_s: float | None
    t_bcast_window: str | None = Field(description="what T_bcast measures, from the coordinator")
    t_bcast_publish_mean_s: float | None = Field(description="learner: publish start -> announced")
    t_bcast_transfer_mean_s: float | None = Field(description="announced -> the last worker samples with it")
    rollout_pause_mean_s: float | None = Field(description="per swap: the engine loading the weights")
    rollout_pause_max_s: float | None
    rollout_pause_num_swaps: int


class RunReport(Section):
    """runs/<run-id>/report.json. Rounded as written: means to 4 digits, wall times to 0.1 s."""

    date: str | None = Field(None, description="the day a committed copy was measured; the runner writes none")
    run_id: str
    num_steps: int = Field(description="learner steps in metrics.jsonl")
    reward_mean_first10: float | None = Field(description="mean train reward of the first 10 steps")
    reward_mean_last10: float | None = Field(description="mean train reward of the last 10 steps")
    wall_s: float = Field(description="the runner's wall time, start to report")
    learner_wall_s: float = Field(description="the learner's run time at its last step (across restarts)")
    learner_train_s: float
    learner_idle_s: float
    learner_busy_fraction: float | None = Field(description="learner_train_s / learner_wall_s")
    staleness_bound: int = Field(description="S")
    max_trained_staleness: int | None
    staleness_histogram: dict[str, int] = Field(description="trained groups by lag t - v")
    num_dropped_stale: int
    num_dropped: dict[str, int] = Field(description="groups dropped by reason, as of the last step")
    eval_accuracy_before: float | None
    eval_accuracy_after: float | None
    evals: list[EvalPoint]
    num_dead_letters: int | None = Field(description="the coordinator's count; None: no final status")
    cost_usd: float | None = Field(description="the coordinator's ledger: learner + workers while active")
    workers: list[WorkerRow]
    zero_variance: ZeroVarianceSection | None = Field(None, description="None in reports written before it existed")
    broadcast: BroadcastSection
    num_restarts: int = Field(description="restarts of every supervised service")
    restarts: dict[str, ServiceRestarts]
    gave_up_on: list[str] = Field(description="services the supervisor left down")
    accounting: GroupAccounting | None = Field(description="None: the groups could not be counted")
    time_use: TimeUse | None = Field(
        None, description="where the time went and the verdict, from the coordinator's last status (shared/time_use.py)"
    )
    plots: list[str] = Field(default_factory=list, description="PNG files next to report.json")

    @field_serializer("accounting")
    def accounting_with_totals(self, accounting: GroupAccounting | None) -> dict[str, Any] | None:
        """Written with its totals (num_unaccounted, ...) for whoever reads the file."""
        return None if accounting is None else accounting.summary()

    @field_validator("accounting", mode="before")
    @classmethod
    def counts_only(cls, value: Any) -> Any:
        """Read back without them: GroupAccounting computes them from the counts."""
        if isinstance(value, dict):
            return {key: count for key, count in value.items() if key not in TOTALS}
        return value


def load_report(path: Path) -> RunReport:
    return RunReport.model_validate_json(path.read_text())


def save_report(path: Path, report: RunReport) -> None:
    path.write_text(report.model_dump_json(indent=2, exclude={"date"} if report.date is None else None))
