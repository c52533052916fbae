"""/v1/capacity, /v1/activation, /v1/cost: the control loop's last pass, as JSON (read-only, no token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from services.coordinator.control import ControlPlane
from shared.api import ActivationInfo, CapacityResponse, CostResponse

router = APIRouter(prefix="/v1", tags=["control"])


def get_control(request: Request) -> ControlPlane:
    return request.app.state.control


ControlDep = Annotated[ControlPlane, Depends(get_control)]


@router.get("/capacity")
def capacity(control: ControlDep) -> CapacityResponse:
    """The capacity model on measured inputs (docs/design.md#the-capacity-model, docs/capacity_model.md): required and
    current throughput, predicted learner utilization, and whether the staleness bound S can hold."""
    return control.current().capacity


@router.get("/activation")
def activation(control: ControlDep) -> ActivationInfo | None:
    """The last activation plan: which workers are active or on standby and why (null when disabled)."""
    return control.current().activation


@router.get("/cost")
def cost(control: ControlDep) -> CostResponse:
    """The cost ledger: cumulative $ of the learner and of every worker while active, and the burn rate."""
    return control.cost(control.current())
