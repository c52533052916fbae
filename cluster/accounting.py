"""Group accounting: where every group a worker produced ended up, read from Redis after a run.

    produced (rollouts written)  = scored + dead-lettered by the reward service + queued for it
    scored                       = trained + dropped by reason + dead-lettered by the learner + queued for it
so  produced = trained + dropped + dead-lettered + pending, which `num_unaccounted` checks (0: nothing lost).

Sources: stream lengths and consumer-group backlogs (nothing trims `rollouts` or `scored`), the dead
letters by source stream, the learner's decision counters (RunKeys.learner_decisions, kept with each
ack) and its trained-group count (LearnerState.num_groups_trained). Read it once every consumer has
stopped (the runner does, before stopping Redis), or the counts move while they are read.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field

from shared.bus import StreamBus, connect
from shared.keys import DEAD_LETTERED, RunKeys
from shared.streams import DEAD, LEARNER_STATE, ROLLOUTS, SCORED


class GroupAccounting(BaseModel):
    """<run_dir>/accounting.json; the run report's `accounting` section."""

    model_config = ConfigDict(extra="forbid")

    num_produced: int = Field(description="rollout groups written by workers (entries of `rollouts`)")
    num_scored: int = Field(description="groups the reward service scored (entries of `scored`)")
    num_trained: int = Field(description="groups trained on, each once (LearnerState.num_groups_trained)")
    num_dropped: dict[str, int] = Field(description="groups the learner dropped, by reason")
    num_dead_lettered_reward: int = Field(description="rollouts the reward service dead-lettered")
    num_dead_lettered_learner: int = Field(description="scored groups dead-lettered at the learner")
    num_pending_reward: int = Field(description="rollouts not yet scored (never delivered or unacked)")
    num_pending_learner: int = Field(description="scored groups not yet decided by the learner")

    @property
    def num_accounted(self) -> int:
        return (
            self.num_trained
            + sum(self.num_dropped.values())
            + self.num_dead_lettered_reward
            + self.num_dead_lettered_learner
            + self.num_pending_reward
            + self.num_pending_learner
        )

    @property
    def num_unaccounted(self) -> int:
        """produced - (trained + dropped + dead-lettered + pending): 0 when nothing was lost."""
        return self.num_produced - self.num_accounted

    def summary(self) -> dict:
        return {**self.model_dump(), "num_accounted": self.num_accounted, "num_unaccounted": self.num_unaccounted}


def count_groups(redis_url: str, run_id: str) -> GroupAccounting:
    """The accounting of run `run_id` as Redis holds it now."""
    client = connect(redis_url, socket_timeout_s=10.0)
    try:
        bus = StreamBus(client, RunKeys(run_id), service="accounting")
        return groups_of(bus)
    finally:
        client.close()


def groups_of(bus: StreamBus) -> GroupAccounting:
    keys = bus.keys
    dead_by_source = Counter(letter.source_stream for letter in bus.entries(DEAD))
    decisions = bus.counts(keys.learner_decisions)
    state = bus.get_state(LEARNER_STATE)
    return GroupAccounting(
        num_produced=bus.length(ROLLOUTS),
        num_scored=bus.length(SCORED),
        num_trained=state.num_groups_trained if state is not None else 0,
        num_dropped={reason: count for reason, count in sorted(decisions.items()) if reason != DEAD_LETTERED},
        num_dead_lettered_reward=dead_by_source[keys.name_of(ROLLOUTS)],
        num_dead_lettered_learner=dead_by_source[keys.name_of(SCORED)],
        num_pending_reward=bus.backlog(ROLLOUTS),
        num_pending_learner=bus.backlog(SCORED),
    )
