"""The coordinator's HTTP layer lives in services/coordinator/routers/: every endpoint the app documents
is a path function of one of its modules (the app's own /healthz aside)."""

from __future__ import annotations

from pathlib import Path

import redis

from services.coordinator.app import create_app
from services.coordinator.routers import (
    broadcast,
    cluster,
    control,
    operators,
    status,
    trust,
    weights,
    work,
    workers,
)
from shared.config import load_run_config

ROUTER_MODULES = (workers, cluster, trust, status, broadcast, control, weights, operators, work)


def test_every_endpoint_but_healthz_is_served_by_a_router_module(repo_root: Path) -> None:
    app = create_app(
        load_run_config(repo_root / "configs" / "demo.toml"), redis.Redis(), "layout-admin-token-0123456789"
    )
    documented = {
        (path, method.upper()) for path, operations in app.openapi()["paths"].items() for method in operations
    }
    in_routers = {
        (route.path, method) for module in ROUTER_MODULES for route in module.router.routes for method in route.methods
    }
    assert documented - in_routers == {("/healthz", "GET")}
    assert in_routers <= documented
