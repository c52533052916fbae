"""A trust score per rollout worker, from the log-probs the learner recomputes anyway (docs/trust.md).

Per trained group, the statistic is the mean over its completion tokens of |log mu - log pi_prox|: mu the
worker's behaviour log-probs, pi_prox the learner's recomputation at its version t. An honest group sampled
with version v = t - k differs from pi_prox only by the k updates since v (plus the engines' numerics), so
its statistic stays inside a band measured per lag on honest runs (`[trust] band_nats`). Invented log-probs,
weights older than claimed, or token ids that are not what was sampled leave it.

When the learner holds the claimed version's weights the comparison can be exact: at lag 0 pi_prox *is*
version v, and for a sample of older groups a spot audit (audit.py) recomputes pi_v. An honest worker
matches to engine precision (a tolerance measured on the policy itself, numerics.py); a worker sampling
with other weights does not, and that costs it AUDIT_FAILURE_WEIGHT.

The score is a one-sided CUSUM over groups: + AUDIT_FAILURE_WEIGHT for a failed exact comparison,
+ SUSPICIOUS_WEIGHT for an unchecked group outside its band (a group that passed an exact comparison is
honest whatever its statistic), - HONEST_DECAY otherwise (floored at 0). At
`quarantine_score` the worker is suspect, and stays so until an admin releases it (the coordinator counts
releases in the QUARANTINE key; a new release resets the score).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.learner.batch import AdmittedGroup, TrainBatch
from shared.config import TrustConfig
from shared.messages import QuarantinedWorkers, WorkerTrust

AUDIT_FAILURE_WEIGHT = 5.0  # score added by a failed exact comparison: two make a suspect
SUSPICIOUS_WEIGHT = 1.0  # score added by an unchecked group outside its band
HONEST_DECAY = 0.25  # score removed by any other group (the CUSUM's drift; floor 0)


@dataclass(frozen=True)
class GroupStatistic:
    """One trained group's statistic (rows of the step's batch: `first_row` .. + num_samples)."""

    worker_id: str
    policy_version: int
    lag: int
    first_row: int
    num_samples: int
    num_tokens: int
    abs_diff_nats: float  # mean |log mu - log pi_prox| over the group's completion tokens


def group_statistics(groups: list[AdmittedGroup], tensors: TrainBatch, logprobs: torch.Tensor) -> list[GroupStatistic]:
    """Per group, in `tensorize` order: mean |log mu - log pi_prox| over its trained completion tokens (under
    per_token admission the tokens older than S are not trained, and not held to the band either: the
    exact audit checks them against their own version).

    logprobs: (B, T - 1) pi_prox, the learner's recomputation, aligned with `tensors` (float32, CPU).
    """
    rollouts = [admitted.group.rollout for admitted in groups]
    diffs = group_abs_diffs(logprobs, tensors.behaviour_logprobs, tensors.loss_mask, [r.num_samples for r in rollouts])
    statistics: list[GroupStatistic] = []
    first_row = 0
    for admitted, rollout, (num_tokens, abs_diff_nats) in zip(groups, rollouts, diffs, strict=True):
        statistics.append(
            GroupStatistic(
                worker_id=rollout.worker_id,
                policy_version=rollout.policy_version,
                lag=admitted.staleness,
                first_row=first_row,
                num_samples=rollout.num_samples,
                num_tokens=num_tokens,
                abs_diff_nats=abs_diff_nats,
            )
        )
        first_row += rollout.num_samples
    return statistics


def group_abs_diffs(
    logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, completion_mask: torch.Tensor, num_samples: list[int]
) -> list[tuple[int, float]]:
    """Per group of consecutive rows (`num_samples` rows each): (num_tokens, mean |log mu - log pi| over its
    completion tokens; 0.0 for a group without any). All tensors (b, T - 1), rows aligned."""
    abs_diff = (logprobs - behaviour_logprobs).abs() * completion_mask  # (b, T - 1)
    per_row_sum = abs_diff.sum(dim=1)  # (b,)
    per_row_tokens = completion_mask.sum(dim=1)  # (b,)
    diffs: list[tuple[int, float]] = []
    first_row = 0
    for count in num_samples:
        rows = slice(first_row, first_row + count)
        num_tokens = int(per_row_tokens[rows].sum())
        total = float(per_row_sum[rows].sum())
        diffs.append((num_tokens, total / num_tokens if num_tokens else 0.0))
        first_row += count
    return diffs


@dataclass
class WorkerScore:
    """The running state behind one worker's WorkerTrust."""

    score: float = 0.0
    suspect: bool = False
    num_groups: int = 0
    num_suspicious: int = 0
    num_audits: int = 0
    num_audit_failures: int = 0
    num_provenance_checks: int = 0
    num_provenance_failures: int = 0
    num_releases_seen: int = 0
    last_statistic_nats: float = 0.0

    def public(self) -> WorkerTrust:
        return WorkerTrust(
            score=self.score,
            suspect=self.suspect,
            num_groups=self.num_groups,
            num_suspicious=self.num_suspicious,
            num_audits=self.num_audits,
            num_audit_failures=self.num_audit_failures,
            num_provenance_checks=self.num_provenance_checks,
            num_provenance_failures=self.num_provenance_failures,
            num_releases_seen=self.num_releases_seen,
            last_statistic_nats=self.last_statistic_nats,
        )


@dataclass(frozen=True)
class Verdict:
    """What one group did to its worker's score."""

    suspicious: bool
    audit_failed: bool
    score: float


class TrustTracker:
    """Scores of every worker the learner has trained on (this process; a restart starts them at 0)."""

    def __init__(self, config: TrustConfig) -> None:
        self.config = config
        self.scores: dict[str, WorkerScore] = {}
        self.known_releases: dict[str, int] = {}  # the coordinator's release counts as last read

    def band_nats(self, lag: int) -> float:
        """The honest band of a group at claimed lag `lag` (the last entry for lags past the list)."""
        bands = self.config.band_nats
        return bands[min(max(lag, 0), len(bands) - 1)]

    def observe(
        self,
        worker_id: str,
        lag: int,
        abs_diff_nats: float,
        exact_diff_nats: float | None,
        tolerance_nats: float | None = None,
        provenance_failed: bool | None = None,
    ) -> Verdict:
        """Add one group's evidence. `exact_diff_nats`: its mean |log mu - log pi_v| at the claimed version
        when the learner could compute it (None: not checked). `tolerance_nats`: how far an exact comparison
        may be off (numerics.py, measured; None: audit_tolerance_nats); the band is never below it.
        `provenance_failed`: the group's keyed-sampling check (provenance.py; None: not checked); a failure
        is a failed audit."""
        tolerance_nats = tolerance_nats if tolerance_nats is not None else self.config.audit_tolerance_nats
        worker = self.scores.get(worker_id)
        if worker is None:  # a worker released before this learner process saw it starts released
            worker = self.scores[worker_id] = WorkerScore(num_releases_seen=self.known_releases.get(worker_id, 0))
        if exact_diff_nats is not None:  # exact evidence decides; the band is for groups nobody could check
            suspicious, audit_failed = False, exact_diff_nats > tolerance_nats
        else:
            suspicious, audit_failed = abs_diff_nats > max(self.band_nats(lag), tolerance_nats), False
        audit_failed = audit_failed or bool(provenance_failed)
        worker.num_groups += 1
        worker.num_suspicious += suspicious
        worker.num_audits += exact_diff_nats is not None
        worker.num_audit_failures += audit_failed
        worker.num_provenance_checks += provenance_failed is not None
        worker.num_provenance_failures += bool(provenance_failed)
        worker.last_statistic_nats = abs_diff_nats
        step = suspicious * SUSPICIOUS_WEIGHT + audit_failed * AUDIT_FAILURE_WEIGHT
        worker.score = worker.score + step if step else max(0.0, worker.score - HONEST_DECAY)
        # sticky: a suspect stays one until released, however honest its later groups look
        worker.suspect = worker.suspect or worker.score >= self.config.quarantine_score
        return Verdict(suspicious=suspicious, audit_failed=audit_failed, score=worker.score)

    def apply_releases(self, quarantine: QuarantinedWorkers | None) -> list[str]:
        """Reset the score of every worker an admin released since we last looked; returns their ids."""
        if quarantine is None:
            return []
        self.known_releases = dict(quarantine.num_releases)
        released = []
        for worker_id, num_releases in quarantine.num_releases.items():
            worker = self.scores.get(worker_id)
            if worker is not None and num_releases > worker.num_releases_seen:
                self.scores[worker_id] = WorkerScore(num_releases_seen=num_releases)
                released.append(worker_id)
        return released

    def snapshot(self) -> dict[str, WorkerTrust]:
        return {worker_id: score.public() for worker_id, score in sorted(self.scores.items())}
