"""Groups with zero reward variance ("flat"): counting them, and the warning when a run cannot learn.

A group whose samples all got the same reward has advantages all 0 (grpo.py `group_advantages`), so it
adds nothing to the gradient. When (nearly) every group of a step is flat the step changes nothing, and
the log repeats `reward 0.000 ... ess 1.000` with the policy standing still. Which reward the groups sit
at tells the likely cause apart:

    flat at 0      the model never scores: a prompt format it does not follow (an instruct model on the
                   raw `a+b=` prompts), answers cut by max_new_tokens, a verifier that rejects its answers
    flat at max 1  it always scores: the task is too easy for it, nothing is left to learn
    flat between   every sample gets the same partial reward: the reward does not tell answers apart

    FlatGroupTally     counts a step's groups as the batch collector decides them -> a FlatGroups record
    ZeroVarianceAlarm  warns once warn_steps steps in a row were at or above warn_fraction flat, then at
                       most every warn_every_steps steps while that lasts; a step below it clears the alarm.
                       A "step" is groups_per_step groups past the admission rule (the collector's
                       windows): one learner step, or with dynamic sampling as many groups skipped
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.config import GRPOConfig
from shared.flat_groups import FLAT_TOLERANCE, is_flat
from shared.messages import FlatGroups, ScoredGroup

MAX_REWARD = 1.0  # the task contract: rewards in [0, 1] (shared/tasks/base.py)
WARN_FRACTION = 0.9  # a step counts when this share (or more) of its groups were flat
WARN_STEPS = 5  # such steps in a row before the first warning: a run cannot learn while it lasts
WARN_EVERY_STEPS = 50  # while it lasts, at most one warning per this many steps


@dataclass
class FlatGroupTally:
    """A step's groups as they are decided: trained, or skipped as flat by dynamic sampling."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FlatGroups.model_fields, 0))

    def add(self, group: ScoredGroup, *, skipped: bool) -> None:
        counts, rewards = self.counts, group.rewards
        counts["num_groups"] += 1
        counts["num_samples"] += len(rewards)
        counts["num_samples_cut"] += sum(reason == "length" for reason in group.rollout.finish_reasons)
        counts["num_skipped"] += skipped
        if is_flat(rewards):
            counts[flat_kind(rewards[0])] += 1

    def record(self) -> FlatGroups:
        return FlatGroups(**self.counts)


def flat_kind(reward: float) -> str:
    """The FlatGroups field counting a flat group at `reward`."""
    if abs(reward) <= FLAT_TOLERANCE:
        return "num_flat_at_zero"
    if abs(reward - MAX_REWARD) <= FLAT_TOLERANCE:
        return "num_flat_at_max"
    return "num_flat_other"


@dataclass
class ZeroVarianceAlarm:
    """Hysteresis over steps: `observe` each step's FlatGroups; it returns the warning to log when one is due."""

    warn_fraction: float
    warn_steps: int
    warn_every_steps: int
    max_new_tokens: int
    num_steps_above: int = 0  # consecutive steps at or above warn_fraction, up to the last one observed
    warning: str | None = None  # the last warning returned, while the alarm stays raised (into LearnerState)
    _streak: list[FlatGroups] = field(default_factory=list)  # those steps' counts
    _warned_at_step: int | None = None  # num_steps_above when it last warned

    @classmethod
    def from_config(cls, grpo: GRPOConfig) -> ZeroVarianceAlarm:
        return cls(
            warn_fraction=WARN_FRACTION,
            warn_steps=WARN_STEPS,
            warn_every_steps=WARN_EVERY_STEPS,
            max_new_tokens=grpo.max_new_tokens,
        )

    def observe(self, flat: FlatGroups) -> str | None:
        """One step's worth of groups (BatchCollector's `on_window`); returns the warning if it is due now
        (first after warn_steps of them in a row at or above warn_fraction, then every warn_every_steps
        more), else None."""
        if flat.num_groups == 0 or flat.zero_variance_fraction < self.warn_fraction:
            self.num_steps_above, self.warning, self._warned_at_step = 0, None, None
            self._streak = []
            return None
        self.num_steps_above += 1
        self._streak = [*self._streak, flat][-self.warn_steps :]  # the cause is read off the last warn_steps
        if self.num_steps_above < self.warn_steps:
            return None
        if self._warned_at_step is not None and self.num_steps_above - self._warned_at_step < self.warn_every_steps:
            return None
        self._warned_at_step = self.num_steps_above
        self.warning = diagnose(FlatGroups.total(self._streak), len(self._streak), self.max_new_tokens)
        return self.warning


def diagnose(flat: FlatGroups, num_steps: int, max_new_tokens: int) -> str:
    """The warning for `flat` (the counts of `num_steps` steps in a row), naming the likely cause. Under dynamic
    sampling that still trains some groups, the run learns from those: the warning says what the flat ones cost
    (groups generated per group trained) instead of "not learning"."""
    learning_on_the_rest = flat.num_skipped > 0 and flat.num_trained > 0
    consequence = (
        f"they carry no gradient; dynamic sampling skipped {flat.num_skipped} of them and trained the "
        f"{flat.num_trained} others, so the policy learns, at {flat.groups_per_trained_group:.1f} groups generated "
        "per group trained. "
        if learning_on_the_rest
        else "so their advantages and gradient are 0: the policy is not learning. "
    )
    summary = (
        f"zero reward variance: in {flat.zero_variance_fraction:.0%} of the last {flat.num_groups} groups "
        f"({num_steps} steps' worth) every sample scored the same ({flat.num_flat_at_zero} all 0, "
        f"{flat.num_flat_at_max} all 1, {flat.num_flat_other} other): " + consequence
    )
    cut = f"{flat.cut_fraction:.0%} of samples stopped at max_new_tokens = {max_new_tokens}"
    if flat.num_flat_at_zero >= max(flat.num_flat_at_max, flat.num_flat_other):
        cause = (
            ("Most samples score 0" if learning_on_the_rest else "The model never scores")
            + ". Likely causes: a task format the model does not follow (an instruct model on raw-text prompts "
            "such as arithmetic_mod10's 'a+b=', or an answer format it never writes: pick a chat task it can "
            f"answer, docs/tasks.md); answers cut short ({cut}"
            + ("; raise it" if flat.cut_fraction >= 0.5 else "")
            + "); a task too hard for the base; or a verifier that rejects its answers (score a few completions "
            "by hand)."
        )
    elif flat.num_flat_at_max >= flat.num_flat_other:
        cause = "The model always scores: the task is too easy for it (or the verifier accepts anything)."
    else:
        cause = (
            "Every sample gets the same partial reward: the reward does not tell answers apart (check the verifier)."
        )
    if flat.num_skipped and not flat.num_trained:
        cause += " Dynamic sampling skipped every one of them: the batch cannot fill."
    return summary + cause
