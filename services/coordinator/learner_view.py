"""The coordinator's read-only view of the learner: its `LearnerState`, which the learner keeps under one key."""

from __future__ import annotations

from dataclasses import dataclass

from shared.bus import StreamBus
from shared.config import RunConfig
from shared.messages import LearnerState
from shared.streams import LEARNER_STATE


@dataclass(frozen=True)
class LearnerView:
    """Where the learner is now. Before the learner has written any state it is at version 0 (the
    initial weights) and the run file's staleness bound applies."""

    learner_version: int
    staleness_bound: int
    state: LearnerState | None  # None: the learner has not started yet


def read_learner_view(bus: StreamBus, run: RunConfig) -> LearnerView:
    state = bus.get_state(LEARNER_STATE)
    if state is None:
        return LearnerView(learner_version=0, staleness_bound=run.schedule.staleness_bound, state=None)
    # the learner applies the admission rule, so its S is the one that holds (it read the same run file)
    return LearnerView(learner_version=state.learner_version, staleness_bound=state.staleness_bound, state=state)
