"""/v1/status (the run at a glance) and /v1/staleness (the worker gate: is version v still admissible?).
The answers are built in services/coordinator/run_view.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from services.coordinator.deps import CoordinatorDep
from services.coordinator.run_view import staleness_verdict, status_response
from shared.api import StalenessResponse, StatusResponse

router = APIRouter(prefix="/v1", tags=["run"])


@router.get("/staleness")
def staleness(
    coordinator: CoordinatorDep,
    policy_version: Annotated[int, Query(ge=0, description="the version the worker's engine holds")],
) -> StalenessResponse:
    """Whether a group sampled now with `policy_version` can still be trained on (t - v <= S), and for
    how many more learner steps. Before the learner reports anything, t = 0."""
    return staleness_verdict(coordinator, policy_version)


@router.get("/status")
def run_status(coordinator: CoordinatorDep) -> StatusResponse:
    """The learner's state, how deep each stream is, dead letters, and every worker."""
    return status_response(coordinator)
