"""The run report: runs/<run-id>/report.json (a RunReport, cluster/run_report.py) plus PNG plots, built
from the learner's files.

Reads <run_dir>/metrics.jsonl (one StepRecord per learner step, plus EvalRecords; the zero-variance
section sums their FlatGroups), broadcast.jsonl
(PublishRecords), the coordinator's T_bcast per version (broadcast_times.json), the cluster's last
coordinator status (workers and their versions, dead letters), the supervisor's restarts
(supervision.json) and the group accounting (accounting.json); all parsed into the typed records of
shared/run_records.py, shared/api.py, cluster/supervisor.py and cluster/accounting.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cluster.accounting import GroupAccounting
from cluster.run_report import (
    BroadcastSection,
    EvalPoint,
    RunReport,
    WorkerRow,
    ZeroVarianceSection,
    save_report,
)
from cluster.supervisor import SupervisionRecord
from shared.api import BroadcastTimesResponse, StatusResponse
from shared.config import RunConfig
from shared.messages import FlatGroups
from shared.run_records import EvalRecord, StepRecord, read_metrics, read_publish_journal
from shared.staleness import DropReason


def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def build_report(
    run_dir: Path,
    run: RunConfig,
    status: StatusResponse | None,
    wall_s: float,
    steps: list[StepRecord],
    evals: list[EvalRecord],
) -> RunReport:
    """The run's report, plots aside, from its records in `run_dir` and the coordinator's last status."""
    rewards = [step.reward_mean for step in steps]
    staleness: Counter[int] = Counter()
    for step in steps:
        for lag, count in step.staleness_histogram.items():
            staleness[int(lag)] += count
    train_s = sum(step.train_s for step in steps)
    idle_s = sum(step.idle_s for step in steps)
    learner_wall_s = steps[-1].wall_s if steps else 0.0
    dropped = steps[-1].num_dropped if steps else {}
    workers = status.workers if status is not None else []
    supervision = read_supervision(run_dir)
    return RunReport(
        run_id=run.run_id,
        num_steps=len(steps),
        reward_mean_first10=mean(rewards[:10]),
        reward_mean_last10=mean(rewards[-10:]),
        wall_s=round(wall_s, 1),
        learner_wall_s=round(learner_wall_s, 1),
        learner_train_s=round(train_s, 2),
        learner_idle_s=round(idle_s, 2),
        learner_busy_fraction=round(train_s / learner_wall_s, 4) if learner_wall_s else None,
        staleness_bound=run.schedule.staleness_bound,
        max_trained_staleness=max(staleness) if staleness else None,
        staleness_histogram={str(lag): staleness[lag] for lag in sorted(staleness)},
        num_dropped_stale=int(dropped.get(DropReason.STALE.value, 0)),
        num_dropped=dropped,
        eval_accuracy_before=evals[0].eval_accuracy if evals else None,
        eval_accuracy_after=evals[-1].eval_accuracy if evals else None,
        evals=[EvalPoint.of(e) for e in evals],
        num_dead_letters=status.num_dead_letters if status is not None else None,
        cost_usd=status.cost_usd if status is not None else None,  # the coordinator's ledger
        workers=[
            WorkerRow(name=w.name, policy_version=w.policy_version, state=w.state, num_groups_done=w.num_groups_done)
            for w in workers
        ],
        zero_variance=summarize_zero_variance(steps, run, status),
        broadcast=summarize_broadcast(run_dir),
        num_restarts=supervision.num_restarts,
        restarts={name: service.restarts() for name, service in supervision.services.items()},
        gave_up_on=[name for name, service in supervision.services.items() if service.gave_up],
        accounting=read_accounting(run_dir),
        time_use=status.time_use if status is not None else None,
    )


def summarize_zero_variance(
    steps: list[StepRecord], run: RunConfig, status: StatusResponse | None
) -> ZeroVarianceSection:
    """Groups with zero reward variance (every sample scored the same: no gradient) over the run's steps, split
    by the reward they sit at; dynamic sampling's cost; the learner's warnings (docs/operations.md)."""
    total = FlatGroups.total(step.flat_groups for step in steps)
    learner = status.learner if status is not None else None
    # every skip of the run, also those while a batch never filled (no step record holds them)
    dropped = learner.num_dropped if learner is not None else (steps[-1].num_dropped if steps else {})
    num_skipped = dropped.get(DropReason.ZERO_VARIANCE.value, 0)
    num_trained = sum(step.num_groups for step in steps)
    warned_at = [step.step for step in steps if step.zero_variance_warning]
    last_logged = next((step.zero_variance_warning for step in reversed(steps) if step.zero_variance_warning), None)
    # the learner's warning standing at the end (also one raised while a batch never filled), else its last one
    warning = (learner.zero_variance_warning if learner is not None else None) or last_logged
    return ZeroVarianceSection(
        zero_variance_fraction=round(total.zero_variance_fraction, 4) if total.num_groups else None,
        zero_variance_fraction_last10=mean([step.flat_groups.zero_variance_fraction for step in steps[-10:]]),
        num_groups_looked_at=total.num_groups,
        num_flat_at_zero=total.num_flat_at_zero,
        num_flat_at_max=total.num_flat_at_max,
        num_flat_other=total.num_flat_other,
        cut_fraction=round(total.cut_fraction, 4),  # samples that stopped at max_new_tokens
        dynamic_sampling=run.grpo.dynamic_sampling,
        num_skipped=num_skipped,
        groups_per_trained_group=round((num_trained + num_skipped) / num_trained, 4) if num_trained else None,
        warned_at_steps=warned_at,
        warning=warning,
    )


def summarize_broadcast(run_dir: Path) -> BroadcastSection:
    """Weight broadcast: bytes announced per version as a fraction of the full weights (the learner's
    broadcast.jsonl), measured T_bcast, its learner-publication share, and the rollout pause per swap (the
    coordinator's, saved by the runner in broadcast_times.json)."""
    versions = read_publish_journal(run_dir / "broadcast.jsonl")
    deltas = [v.size_fraction for v in versions if v.payload == "delta"]
    times_path = run_dir / "broadcast_times.json"
    times = BroadcastTimesResponse.model_validate_json(times_path.read_text()) if times_path.exists() else None
    seconds = list(times.seconds_by_version.values()) if times is not None else []
    splits = list(times.splits_by_version.values()) if times is not None else []
    publish = [s.publish_s for s in splits if s.publish_s is not None]
    transfer = [s.transfer_s for s in splits if s.transfer_s is not None]
    return BroadcastSection(
        num_versions=len(versions),
        num_delta_versions=len(deltas),
        full_size_bytes=versions[-1].full_size_bytes if versions else None,
        delta_size_fraction_mean=mean(deltas),
        bytes_fraction_overall=round(
            sum(v.payload_size_bytes for v in versions) / sum(v.full_size_bytes for v in versions), 4
        )
        if versions
        else None,
        t_bcast_num_versions=len(seconds),
        t_bcast_mean_s=mean(seconds),
        t_bcast_max_s=round(max(seconds), 4) if seconds else None,
        t_bcast_window=times.window if times is not None else None,
        t_bcast_publish_mean_s=mean(publish),  # learner: publish start -> announced
        t_bcast_transfer_mean_s=mean(transfer),  # announced -> the last worker samples with it
        rollout_pause_mean_s=times.pause_mean_s if times is not None else None,  # per swap: engine loading
        rollout_pause_max_s=times.pause_max_s if times is not None else None,
        rollout_pause_num_swaps=sum(s.num_paused for s in splits),
    )


def read_supervision(run_dir: Path) -> SupervisionRecord:
    """The supervisor's restarts by service, with each crash's exit code (none recorded: no restarts)."""
    path = run_dir / "supervision.json"
    return SupervisionRecord.model_validate_json(path.read_text()) if path.exists() else SupervisionRecord()


def read_accounting(run_dir: Path) -> GroupAccounting | None:
    """Every group produced: trained, dropped by reason, dead-lettered or pending (None: not counted)."""
    path = run_dir / "accounting.json"
    return GroupAccounting.model_validate_json(path.read_text()) if path.exists() else None


def plot(steps: list[StepRecord], evals: list[EvalRecord], report: RunReport, run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s.step for s in steps], [s.reward_mean for s in steps], label="train reward (mean of step)")
    if evals:
        ax.plot(
            [e.eval_step for e in evals],
            [e.eval_accuracy for e in evals],
            "o-",
            label="held-out accuracy (greedy)",
        )
    ax.set(xlabel="learner step", ylabel="reward / accuracy", title="Reward vs step", ylim=(0, 1.05))
    ax.legend()
    paths.append(_save(fig, run_dir / "reward_vs_step.png"))
    paths.append(plot_learning_curves(steps, evals, run_dir / "learning_curves.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    histogram = report.staleness_histogram
    ax.bar([int(lag) for lag in histogram], list(histogram.values()))
    ax.axvline(report.staleness_bound + 0.5, color="red", linestyle="--", label=f"bound S = {report.staleness_bound}")
    ax.set(xlabel="staleness t - v of trained groups (steps)", ylabel="groups", title="Staleness of trained groups")
    ax.legend()
    paths.append(_save(fig, run_dir / "staleness_histogram.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    step_ids = [s.step for s in steps]
    train = [s.train_s for s in steps]
    ax.bar(step_ids, train, label="busy (train)", color="tab:green")
    ax.bar(
        step_ids,
        [s.idle_s for s in steps],
        bottom=train,
        label="idle (waiting for rollouts)",
        color="tab:red",
    )
    ax.set(
        xlabel="learner step",
        ylabel="seconds",
        title=f"Learner busy/idle (busy fraction {report.learner_busy_fraction})",
    )
    ax.legend()
    paths.append(_save(fig, run_dir / "learner_busy_idle.png"))
    return paths


def learning_curve_axes(steps: list[StepRecord], evals: list[EvalRecord]) -> dict[str, dict[str, list[float]]]:
    """Train reward and held-out accuracy against three clocks: learner step, samples trained (cumulative)
    and wall time. An evaluation of version t sits where step t ended (the policy it measured existed then);
    version 0 at zero samples and zero seconds."""
    samples_at = {0: 0.0}
    wall_at = {0: 0.0}
    total = 0
    for record in steps:
        total += record.num_samples
        samples_at[record.step] = float(total)
        wall_at[record.step] = record.wall_s
    evaluated = [e for e in evals if e.eval_step in samples_at]
    return {
        "reward": {
            "step": [float(s.step) for s in steps],
            "samples": [samples_at[s.step] for s in steps],
            "wall_s": [s.wall_s for s in steps],
            "value": [s.reward_mean for s in steps],
        },
        "eval_accuracy": {
            "step": [float(e.eval_step) for e in evaluated],
            "samples": [samples_at[e.eval_step] for e in evaluated],
            "wall_s": [wall_at[e.eval_step] for e in evaluated],
            "value": [e.eval_accuracy for e in evaluated],
        },
    }


def plot_learning_curves(steps: list[StepRecord], evals: list[EvalRecord], path: Path) -> Path:
    """learning_curves.png: reward and held-out accuracy vs step, vs samples trained and vs wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = learning_curve_axes(steps, evals)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, (clock, label) in zip(
        axes, [("step", "learner step"), ("samples", "samples trained"), ("wall_s", "wall time (s)")], strict=True
    ):
        ax.plot(curves["reward"][clock], curves["reward"]["value"], label="train reward (mean of step)", alpha=0.7)
        ax.plot(curves["eval_accuracy"][clock], curves["eval_accuracy"]["value"], "o-", label="held-out accuracy")
        ax.set(xlabel=label, ylim=(0, 1.05))
    axes[0].set(ylabel="reward / accuracy")
    axes[0].legend()
    fig.suptitle("Reward and held-out accuracy (greedy) vs step, samples and wall time")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_report(run_dir: Path, run: RunConfig, status: StatusResponse | None, wall_s: float) -> RunReport:
    steps, evals = read_metrics(run_dir / "metrics.jsonl")
    report = build_report(run_dir, run, status, wall_s, steps, evals)
    if steps:
        report.plots = [path.name for path in plot(steps, evals, report, run_dir)]
    save_report(run_dir / "report.json", report)
    return report
