"""GET /dashboard: one static page (HTML + JS, no build step) polling GET /v1/dashboard and, when the
broadcast router is there, GET /v1/broadcast/plan for the relay tree."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from services.coordinator.control_routes import ControlDep
from services.coordinator.status import learner_info, stream_depths
from shared.api import DashboardResponse
from shared.streams import DEAD

router = APIRouter(tags=["dashboard"])

PAGE_PATH = Path(__file__).parent / "static" / "dashboard.html"


@router.get("/dashboard", response_class=HTMLResponse)
def dashboard_page() -> HTMLResponse:
    """The live dashboard: workers, learner version and utilization, staleness, reward, cost, relay tree."""
    return HTMLResponse(PAGE_PATH.read_text(), headers={"Cache-Control": "no-store"})


@router.get("/v1/dashboard")
def dashboard_data(control: ControlDep) -> DashboardResponse:
    """Everything the dashboard page shows, in one answer (the control loop's last pass + ledger + history)."""
    snapshot = control.current()
    coordinator = control.coordinator
    learner = snapshot.learner
    bus_depths = stream_depths(coordinator.bus)
    return DashboardResponse(
        run_id=coordinator.run.run_id,
        staleness_bound=learner.staleness_bound if learner is not None else coordinator.run.schedule.staleness_bound,
        learner=learner_info(learner) if learner is not None else None,
        workers=snapshot.workers,
        staleness_histogram=dict(learner.staleness_histogram) if learner is not None else {},
        stream_depths={**bus_depths, "dead": coordinator.bus.length(DEAD)},
        history=control.history(),
        capacity=snapshot.capacity,
        activation=snapshot.activation,
        cost=control.cost(snapshot),
    )
