"""The coordinator's read-only view of the learner: its `LearnerState`, which the learner keeps under one key."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import LearnerState


@dataclass(frozen=True)
class LearnerView:
    """Where the learner is now. Before the learner has written any state it is at version 0 (the
    initial weights) and the run file's staleness bound applies."""

    learner_version: int
    staleness_bound: int
    state: LearnerState | None  # None: the learner has not started yet


def read_learner_view(client: redis.Redis, keys: RunKeys, run: RunConfig) -> LearnerView:
    payload = client.get(keys.learner_state)
    if payload is None:
        return LearnerView(learner_version=0, staleness_bound=run.schedule.staleness_bound, state=None)
    state = LearnerState.decode(payload)
    # the learner applies the admission rule, so its S is the one that holds (it read the same run file)
    return LearnerView(learner_version=state.learner_version, staleness_bound=state.staleness_bound, state=state)
