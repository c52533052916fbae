"""/v1/status (the run at a glance) and /v1/staleness (the worker gate: is version v still admissible?)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from services.coordinator.deps import CoordinatorDep
from services.coordinator.learner_view import read_learner_view
from services.coordinator.ledger import CostLedger
from shared.api import LearnerInfo, StalenessResponse, StatusResponse
from shared.bus import StreamBus
from shared.messages import LearnerState
from shared.staleness import is_admissible, steps_remaining
from shared.streams import DEAD, GROUPED_STREAMS

router = APIRouter(prefix="/v1", tags=["run"])


@router.get("/staleness")
def staleness(
    coordinator: CoordinatorDep,
    policy_version: Annotated[int, Query(ge=0, description="the version the worker's engine holds")],
) -> StalenessResponse:
    """Whether a group sampled now with `policy_version` can still be trained on (t - v <= S), and for
    how many more learner steps. Before the learner reports anything, t = 0."""
    learner = read_learner_view(coordinator.bus, coordinator.run)
    return StalenessResponse(
        policy_version=policy_version,
        learner_version=learner.learner_version,
        staleness_bound=learner.staleness_bound,
        admissible=is_admissible(learner.learner_version, policy_version, learner.staleness_bound),
        steps_remaining=steps_remaining(learner.learner_version, policy_version, learner.staleness_bound),
    )


@router.get("/status")
def run_status(coordinator: CoordinatorDep) -> StatusResponse:
    """The learner's state, how deep each stream is, dead letters, and every worker."""
    learner = read_learner_view(coordinator.bus, coordinator.run)
    num_dead_letters = coordinator.bus.length(DEAD)
    return StatusResponse(
        run_id=coordinator.run.run_id,
        staleness_bound=learner.staleness_bound,
        learner=None if learner.state is None else learner_info(learner.state),
        stream_depths={**stream_depths(coordinator.bus), "dead": num_dead_letters},
        num_dead_letters=num_dead_letters,
        workers=coordinator.registry.list_workers(),
        cost_usd=CostLedger(coordinator.redis, coordinator.keys, max_billing_gap_s=1.0).totals().total_usd,
    )


def stream_depths(bus: StreamBus) -> dict[str, int]:
    """Per stream: entries its consumer group has not finished (never delivered plus pending)."""
    return {stream.name: bus.backlog(stream) for stream in GROUPED_STREAMS}


def learner_info(state: LearnerState) -> LearnerInfo:
    return LearnerInfo(
        status=state.status,
        learner_version=state.learner_version,
        published_version=state.published_version,
        num_steps_target=state.num_steps_target,
        num_dropped=dict(state.num_dropped),
        last_reward_mean=state.last_reward_mean,
        busy_fraction=state.busy_fraction,
    )
