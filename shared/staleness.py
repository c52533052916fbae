"""The admission rule: a group sampled by policy version v may train the learner at step t only if
0 <= t - v <= S (S is the run's staleness bound; S = 0 is the synchronous, fully on-policy baseline).
"""

from __future__ import annotations

from enum import StrEnum


class DropReason(StrEnum):
    """Why the learner refused a scored group. Every drop is counted under one of these."""

    STALE = "stale"  # t - v > S: too old to train on
    FUTURE_VERSION = "future_version"  # v > t: no such policy exists yet (a forged or confused worker)
    RUN_MISMATCH = "run_mismatch"  # the group belongs to another run
    QUARANTINED = "quarantined"  # its worker is quarantined (docs/trust.md): nothing it sent is trained on
    # [grpo] dynamic_sampling: every sample got the same reward, so every advantage is 0 and the group
    # would add nothing to the gradient (services/learner/zero_variance.py)
    ZERO_VARIANCE = "zero_variance"


def staleness_of(learner_version: int, policy_version: int) -> int:
    """How many optimizer steps the policy that sampled a group lags the learner."""
    return learner_version - policy_version


def is_admissible(learner_version: int, policy_version: int, staleness_bound: int) -> bool:
    """True when a group sampled by `policy_version` may train the learner at `learner_version`."""
    return 0 <= staleness_of(learner_version, policy_version) <= staleness_bound


def admission_verdict(learner_version: int, policy_version: int, staleness_bound: int) -> DropReason | None:
    """None when admissible, otherwise the reason the group must be dropped."""
    lag = staleness_of(learner_version, policy_version)
    if lag < 0:
        return DropReason.FUTURE_VERSION
    if lag > staleness_bound:
        return DropReason.STALE
    return None


def steps_remaining(learner_version: int, policy_version: int, staleness_bound: int) -> int:
    """How many more learner steps a group of `policy_version` stays admissible (negative: already too old).

    A worker uses this as its gate: with 0 steps remaining its next group is still admissible at the
    learner's current step but not after the next one.
    """
    return staleness_bound - staleness_of(learner_version, policy_version)
