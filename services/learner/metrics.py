"""What the learner records: one JSON line per step and per evaluation, and a summary at the end.

<run_dir>/metrics.jsonl holds two kinds of line, told apart by their first key:
  {"step": ..., ...}       a StepRecord, after every optimizer step
  {"eval_step": ..., ...}  an EvalRecord, at step 0, every eval_every steps and at the end
<run_dir>/learner_summary.json holds a LearnerSummary when the learner stops.

After a crash the learner resumes from its checkpoint at version t and rewrites metrics.jsonl without
the lines past t (those steps are taken again), so the file always describes one history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class StepRecord(BaseModel):
    """One optimizer step. Times in seconds; `wall_s` since the run began (across restarts)."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="index of this step, 1-based: the version it produced")
    policy_version: int = Field(description="learner version after the step")
    train_s: float = Field(description="T_train: forward + backward + optimizer step")
    idle_s: float = Field(description="waiting for admissible rollouts before this step")
    publish_s: float = Field(description="serialise + chunk + sign + announce; 0 when not published")
    reward_mean: float
    reward_std: float
    staleness_histogram: dict[str, int] = Field(description="trained groups: lag t - v -> number of groups")
    max_staleness: int
    num_dropped: dict[str, int] = Field(description="cumulative drops by reason")
    num_dead_lettered: int = Field(description="cumulative groups dead-lettered by the learner")
    num_groups: int
    num_samples: int
    num_tokens: int = Field(description="completion tokens trained on")
    num_replayed_groups: int = Field(description="groups re-read from this consumer's pending entries after a restart")
    loss: float
    ratio_mean: float = Field(description="pi_theta / mu over completion tokens, before truncation")
    clip_fraction: float
    truncated_fraction: float = Field(description="tokens whose importance weight hit max_importance_weight")
    approx_kl: float = Field(description="KL(behaviour || current), k3 estimator")
    grad_norm: float
    wall_s: float


class EvalRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eval_step: int = Field(description="learner version evaluated")
    eval_accuracy: float = Field(description="greedy completions scoring exactly 1.0 on the held-out prompts")
    eval_reward_mean: float
    num_eval_prompts: int
    eval_s: float
    wall_s: float


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
    num_dead_lettered: int = 0
    max_trained_staleness: int = 0
    reward_mean_first: float | None = None
    reward_mean_last: float | None = None
    eval_accuracy_before: float | None = None
    eval_accuracy_last: float | None = None
    eval_step_last: int | None = None

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
        if self.reward_mean_first is None:
            self.reward_mean_first = record.reward_mean
        self.reward_mean_last = record.reward_mean

    def add_eval(self, record: EvalRecord) -> None:
        if record.eval_step == 0:
            self.eval_accuracy_before = record.eval_accuracy
        self.eval_accuracy_last = record.eval_accuracy
        self.eval_step_last = record.eval_step


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


class MetricsLog:
    """Appends records to metrics.jsonl, one flushed line each (safe to tail while the run goes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: StepRecord | EvalRecord) -> None:
        with open(self.path, "a") as f:
            f.write(record.model_dump_json() + "\n")

    def truncate_after(self, policy_version: int) -> int:
        """Drop lines about versions past `policy_version` (taken again after a resume); returns how many."""
        if not self.path.exists():
            return 0
        kept, num_dropped = [], 0
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line torn by the crash itself
                num_dropped += 1
                continue
            if record.get("step", record.get("eval_step", 0)) > policy_version:
                num_dropped += 1
                continue
            kept.append(line)
        tmp_path = self.path.with_suffix(".jsonl.tmp")
        tmp_path.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp_path, self.path)
        return num_dropped

    def read(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def write_summary(path: Path, summary: LearnerSummary) -> None:
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(summary.model_dump_json(indent=2) + "\n")
    os.replace(tmp_path, path)
