"""The control loop's answers and the operator's views, read-only, no token: /v1/capacity,
/v1/activation, /v1/cost (services/coordinator/control.py), the dashboard (/dashboard: one static page,
HTML + JS, no build step, polling /v1/dashboard and /v1/broadcast/plan for the relay tree) and
/metrics (Prometheus text, families built in services/coordinator/prometheus.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.coordinator.deps import ControlDep
from services.coordinator.run_view import dashboard_response
from shared.api import ActivationInfo, CapacityResponse, CostResponse, DashboardResponse

router = APIRouter()

PAGE_PATH = Path(__file__).parent.parent / "static" / "dashboard.html"


@router.get("/v1/capacity", tags=["control"])
def capacity(control: ControlDep) -> CapacityResponse:
    """The capacity model on measured inputs (docs/design.md#the-capacity-model, docs/capacity_model.md): required and
    current throughput, predicted learner utilization, and whether the staleness bound S can hold."""
    return control.current().capacity


@router.get("/v1/activation", tags=["control"])
def activation(control: ControlDep) -> ActivationInfo | None:
    """The last activation plan: which workers are active or on standby and why (null when disabled)."""
    return control.current().activation


@router.get("/v1/cost", tags=["control"])
def cost(control: ControlDep) -> CostResponse:
    """The cost ledger: cumulative $ of the learner and of every worker while active, and the burn rate."""
    return control.cost(control.current())


@router.get("/dashboard", response_class=HTMLResponse, tags=["dashboard"])
def dashboard_page() -> HTMLResponse:
    """The live dashboard: workers, learner version and utilization, staleness, reward, cost, relay tree."""
    return HTMLResponse(PAGE_PATH.read_text(), headers={"Cache-Control": "no-store"})


@router.get("/v1/dashboard", tags=["dashboard"])
def dashboard_data(control: ControlDep) -> DashboardResponse:
    """Everything the dashboard page shows, in one answer (the control loop's last pass + ledger + history)."""
    return dashboard_response(control)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    tags=["observability"],
)
def metrics(request: Request) -> Response:
    """Prometheus exposition: learner steps, idle seconds, staleness, dropped groups, stream depths,
    per-worker samples/s and tokens/s, broadcast seconds, capacity and cost."""
    registry = request.app.state.metrics_registry  # install_metrics (services/coordinator/prometheus.py)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
