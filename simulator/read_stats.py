"""What the simulated learner read: scored groups as the reward service publishes them, and what became of
them (trained at which lag, or dropped as stale), per worker, with their age and their tokens' versions."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ScoredGroups:
    """Groups published together by the reward service: one batch call's, or one continuous group."""

    readable_at_s: float
    policy_version: int  # the groups' version: the call's, or the oldest row's (continuous)
    num_groups: int  # not yet read
    worker: int  # index of the worker that generated them
    started_at_s: float  # the call's start, or the task's lease (continuous)
    # continuous: per version, the group's tokens sampled with it, in mean-length samples; None (batch): every
    # token has policy_version and a group holds G mean-length samples
    tokens_by_version: dict[int, float] | None = None


@dataclass
class ReadStats:
    group_size: int
    max_trained_lag: int | None = None  # per_token admission: S (older tokens of a trained group are masked)
    groups_by_worker: Counter[int] = field(default_factory=Counter)  # scored
    dropped_by_worker: Counter[int] = field(default_factory=Counter)
    num_trained_groups: int = 0
    trained_age_s_total: float = 0.0  # read time - started_at_s, summed over trained groups
    # tokens of trained groups by their own lag (learner version at the read - the token's version), in
    # mean-length samples: in batch mode every token has its group's lag
    token_lags: Counter[int] = field(default_factory=Counter)
    trained_tokens: float = 0.0
    dropped_tokens: float = 0.0

    def scored(self, entry: ScoredGroups) -> None:
        self.groups_by_worker[entry.worker] += entry.num_groups

    def read(self, entry: ScoredGroups, num_groups: int, learner_version: int, now_s: float, dropped: bool) -> None:
        """`num_groups` of `entry` read at `now_s`, trained or dropped."""
        tokens = entry.tokens_by_version or {entry.policy_version: float(self.group_size * entry.num_groups)}
        share = num_groups / entry.num_groups  # a batch entry may be read in parts; its tokens are spread evenly
        if dropped:
            self.dropped_by_worker[entry.worker] += num_groups
            self.dropped_tokens += share * sum(tokens.values())
            return
        self.num_trained_groups += num_groups
        self.trained_age_s_total += num_groups * (now_s - entry.started_at_s)
        for version, amount in tokens.items():
            lag = learner_version - version
            if self.max_trained_lag is not None and lag > self.max_trained_lag:  # per_token: masked, not trained
                self.dropped_tokens += share * amount
                continue
            self.token_lags[lag] += share * amount
            self.trained_tokens += share * amount

    @property
    def mean_age_s(self) -> float:
        return self.trained_age_s_total / self.num_trained_groups if self.num_trained_groups else 0.0

    @property
    def dropped_token_fraction(self) -> float:
        total = self.trained_tokens + self.dropped_tokens
        return self.dropped_tokens / total if total else 0.0

    def token_lag_fractions(self) -> dict[int, float]:
        return {lag: amount / self.trained_tokens for lag, amount in sorted(self.token_lags.items())}
