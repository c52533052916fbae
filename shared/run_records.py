"""The learner's records, as files in <run_dir>: the contract between the learner (writer) and the tooling
that reads them (cluster/report.py, simulator/validation.py, tests).

    metrics.jsonl          one StepRecord per optimizer step and one EvalRecord per evaluation, told apart
                           by their key "step" / "eval_step"
    broadcast.jsonl        one PublishRecord per announced version (bytes as a fraction of the full size)
    trust.jsonl            one GroupTrustRecord per trained group: the trust statistic (docs/trust.md)
    learner_summary.json   a LearnerSummary when the learner stops

Readers parse lines into these classes (`read_metrics`, `read_publish_journal`), so a renamed field fails
loudly instead of reading as missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.messages import EvalRecord, FlatGroups, StepDiagnostics, WorkerMismatch


class StepRecord(StepDiagnostics):
    """One learner step: one batch, num_minibatches * ppo_epochs optimizer updates, one policy version.
    Times in seconds; `wall_s` since the run began (across restarts). Its loss and off-policy diagnostics
    are the fields of StepDiagnostics (shared/messages.py), inherited: a metrics.jsonl line stays flat."""

    # the diagnostics are a strict, frozen wire type; a record read from a file is neither
    model_config = ConfigDict(extra="forbid", strict=False, frozen=False)

    step: int = Field(description="index of this step, 1-based: the version it produced")
    policy_version: int = Field(description="learner version after the step")
    train_s: float = Field(description="T_train: every forward, backward and optimizer update of the step")
    idle_s: float = Field(description="waiting for admissible rollouts before this step")
    publish_s: float = Field(description="serialise + chunk + sign + announce; 0 when not published")
    reward_mean: float
    reward_std: float
    staleness_histogram: dict[str, int] = Field(description="trained groups: lag t - v -> number of groups")
    token_staleness_histogram: dict[str, int] = Field(
        default_factory=dict,
        description="trained completion tokens: lag t - v of the version that sampled each -> number of tokens "
        "(a group's lag is its oldest token's)",
    )
    max_staleness: int
    num_dropped: dict[str, int] = Field(description="cumulative drops by reason")
    stale_token_lags: dict[str, int] = Field(
        default_factory=dict,
        description="cumulative: tokens of the groups dropped as stale, by each token's own lag at the drop "
        "(those at lag <= S are what a per-token admission rule would have trained)",
    )
    num_dead_lettered: int = Field(description="cumulative groups dead-lettered by the learner")
    num_groups: int
    num_samples: int
    num_tokens: int = Field(description="completion tokens trained on")
    num_replayed_groups: int = Field(description="groups re-read from this consumer's pending entries after a restart")
    wall_s: float
    mismatch_by_worker: dict[str, WorkerMismatch] = Field(
        default_factory=dict,
        description="engine mismatch (behaviour vs recomputed log-probs) over lag-0 tokens, by worker id; "
        "rollouts carry no engine name, so there is no split by engine",
    )
    flat_groups: FlatGroups = Field(
        default_factory=FlatGroups,
        description="the step's groups with zero reward variance (no gradient), split by the reward they sit at; "
        "with dynamic sampling, also the flat groups it skipped (the batch's cost in generated groups)",
    )
    zero_variance_warning: str | None = Field(
        None, description="the learner's zero-variance warning, on the steps where it logged one (docs/operations.md)"
    )

    @property
    def diagnostics(self) -> StepDiagnostics:
        """The step's diagnostics alone (as LearnerState.last_step carries them)."""
        return StepDiagnostics(**self.model_dump(include=set(StepDiagnostics.model_fields)))


class RunTotals(BaseModel):
    """Cumulative counters, kept in every checkpoint so a resumed run continues them."""

    model_config = ConfigDict(extra="forbid")

    wall_s: float = 0.0  # run time up to the last update (a restart continues from the checkpoint's)
    train_s: float = 0.0
    idle_s: float = 0.0
    publish_s: float = 0.0
    checkpoint_s: float = 0.0
    num_steps: int = 0
    num_groups: int = 0
    num_samples: int = 0
    num_tokens: int = 0
    num_replayed_groups: int = 0
    num_restarts: int = 0
    num_dropped: dict[str, int] = Field(default_factory=dict)  # by reason; kept by the collector, synced here
    stale_token_lags: dict[str, int] = Field(default_factory=dict)  # dropped-as-stale tokens by lag; collector's
    num_dead_lettered: int = 0
    max_trained_staleness: int = 0
    staleness_histogram: dict[str, int] = Field(default_factory=dict)  # trained groups by lag t - v, whole run
    token_staleness_histogram: dict[str, int] = Field(default_factory=dict)  # trained tokens by their own lag
    reward_mean_first: float | None = None
    reward_mean_last: float | None = None
    eval_accuracy_before: float | None = None
    eval_accuracy_last: float | None = None
    eval_step_last: int | None = None
    eval_stall_s: float = 0.0  # training-loop time spent handing evaluations over (skipped ones included)
    num_evals_skipped: int = 0  # due while the previous evaluation ran past [learner] eval_max_stall_s
    last_eval: EvalRecord | None = None  # the newest evaluation's whole record (LearnerState.last_eval)

    @property
    def busy_fraction(self) -> float:
        return self.train_s / self.wall_s if self.wall_s > 0 else 0.0

    def add_step(self, record: StepRecord) -> None:
        self.wall_s = record.wall_s
        self.train_s += record.train_s
        self.idle_s += record.idle_s
        self.publish_s += record.publish_s
        self.num_steps += 1
        self.num_groups += record.num_groups
        self.num_samples += record.num_samples
        self.num_tokens += record.num_tokens
        self.num_replayed_groups += record.num_replayed_groups
        self.max_trained_staleness = max(self.max_trained_staleness, record.max_staleness)
        for lag, count in record.staleness_histogram.items():
            self.staleness_histogram[lag] = self.staleness_histogram.get(lag, 0) + count
        for lag, count in record.token_staleness_histogram.items():
            self.token_staleness_histogram[lag] = self.token_staleness_histogram.get(lag, 0) + count
        if self.reward_mean_first is None:
            self.reward_mean_first = record.reward_mean
        self.reward_mean_last = record.reward_mean

    def add_eval(self, record: EvalRecord) -> None:
        if record.eval_step == 0:
            self.eval_accuracy_before = record.eval_accuracy
        self.eval_accuracy_last = record.eval_accuracy
        self.eval_step_last = record.eval_step
        self.last_eval = record


class LearnerSummary(BaseModel):
    """<run_dir>/learner_summary.json, written when the learner stops."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    finished: bool = Field(description="reached num_steps or max_wall_s (False: stopped by a signal)")
    stop_reason: str = Field(description="num_steps | max_wall_s | signal")
    policy_version: int
    num_steps: int = Field(description="optimizer steps of this run (== policy_version)")
    staleness_bound: int
    wall_s: float
    s_per_step: float = Field(description="wall_s / num_steps")
    train_s_per_step: float = Field(description="mean T_train")
    busy_fraction: float = Field(description="sum(train_s) / wall_s")
    totals: RunTotals
    eval_accuracy_before: float | None
    eval_accuracy_after: float | None
    reward_mean_first: float | None
    reward_mean_last: float | None
    max_trained_staleness: int
    num_dropped: dict[str, int]
    model_final_dir: str | None = Field(description="HF folder of the final policy (None when stopped early)")


class PublishRecord(BaseModel):
    """One announced version, a line of broadcast.jsonl (written by services/learner/publish.py)."""

    model_config = ConfigDict(extra="forbid")

    policy_version: int
    payload: Literal["full", "delta"]
    base_version: int = Field(description="the version a delta applies to; -1 for a full payload")
    payload_size_bytes: int = Field(description="bytes announced for this version")
    full_size_bytes: int = Field(description="bytes of the full weights of this version")
    size_fraction: float = Field(description="payload_size_bytes / full_size_bytes")
    publish_s: float = Field(description="serialise + chunk + sign + announce")
    published_at_s: float = Field(description="unix time of the announcement")


class GroupTrustRecord(BaseModel):
    """One trained group's trust evidence (services/learner/trust.py, docs/trust.md)."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="the learner version the group trained at (t, before the step)")
    worker_id: str
    policy_version: int = Field(description="v, the version the worker claims it sampled with")
    lag: int = Field(description="claimed lag t - v")
    num_tokens: int = Field(description="completion tokens of the group")
    abs_diff_nats: float = Field(description="mean |log mu - log pi_prox| over them")
    exact_diff_nats: float | None = Field(
        description="mean |log mu - log pi_v| at the claimed version (lag 0, or a spot audit); None: not checked"
    )
    audit_s: float = Field(description="wall seconds of the spot audit (0: none)")
    tolerance_nats: float = Field(
        0.0, description="the exact checks' tolerance at this step (measured, services/learner/numerics.py)"
    )
    suspicious: bool = Field(description="abs_diff_nats above the band of its lag (and the tolerance)")
    audit_failed: bool = Field(description="exact_diff_nats above tolerance_nats, or provenance_failed")
    score: float = Field(description="the worker's score after this group")
    provenance_violations: int | None = Field(
        None, description="tokens outside their keyed-sampling interval by more than the tolerance; None: not checked"
    )
    provenance_max_gap: float | None = Field(None, description="the largest gap over the group's tokens (probability)")
    provenance_failed: bool = Field(False, description="the group failed its sampling-provenance check")


def read_trust_records(path: Path) -> list[GroupTrustRecord]:
    return [GroupTrustRecord.model_validate_json(line) for line in _lines(path)]


def read_metrics(path: Path) -> tuple[list[StepRecord], list[EvalRecord]]:
    """The step and eval records of a metrics.jsonl, in file order (none when the file does not exist)."""
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    for line in _lines(path):
        record = json.loads(line)
        if "eval_step" in record:
            evals.append(EvalRecord.model_validate(record))
        else:
            steps.append(StepRecord.model_validate(record))
    return steps, evals


def read_publish_journal(path: Path) -> list[PublishRecord]:
    return [PublishRecord.model_validate_json(line) for line in _lines(path)]


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line.strip()]
