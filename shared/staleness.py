"""The admission rule: a group sampled by policy version v may train the learner at step t only if
0 <= t - v <= S (S is the run's staleness bound; S = 0 is the synchronous, fully on-policy baseline).

A group sampled with continuous batching can hold tokens of several versions (docs/continuous_batching.md):
its policy_version v is its oldest token's, its newest token's version is w >= v. `[schedule] admission`
says which of them the bound applies to:
    oldest_token   t - v <= S: the whole group is fresh enough, or it is dropped
    per_token      t - w <= S: the group is admitted while any token is fresh enough, and the learner
                   trains only its tokens of versions >= t - S (the older ones are masked out of the loss)
Either way a group with a token from a version newer than t is refused.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

AdmissionRule = Literal["oldest_token", "per_token"]


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


def admission_verdict(
    learner_version: int,
    policy_version: int,
    staleness_bound: int,
    *,
    newest_version: int | None = None,
    rule: AdmissionRule = "oldest_token",
) -> DropReason | None:
    """None when admissible, otherwise the reason the group must be dropped. `policy_version`: the group's
    oldest token's version; `newest_version`: its newest token's (None: the same)."""
    newest = policy_version if newest_version is None else newest_version
    if staleness_of(learner_version, newest) < 0:
        return DropReason.FUTURE_VERSION
    bounded = policy_version if rule == "oldest_token" else newest
    if staleness_of(learner_version, bounded) > staleness_bound:
        return DropReason.STALE
    return None


def max_trained_token_lag(rule: AdmissionRule, staleness_bound: int) -> int | None:
    """The oldest lag a trained token of an admitted group may have: S under per_token (older tokens are
    masked out of the loss); None under oldest_token (every token of an admitted group is trained)."""
    return staleness_bound if rule == "per_token" else None


def steps_remaining(learner_version: int, policy_version: int, staleness_bound: int) -> int:
    """How many more learner steps a group of `policy_version` stays admissible (negative: already too old).

    A worker uses this as its gate: with 0 steps remaining its next group is still admissible at the
    learner's current step but not after the next one.
    """
    return staleness_bound - staleness_of(learner_version, policy_version)
