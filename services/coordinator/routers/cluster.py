"""/v1/cluster/bootstrap: what a worker started with only the coordinator's URL and the join token
needs to join (`relay-rl worker`): the run file, the run id, the weights' public key, the Redis URL and
the model. Join token in header X-RL-Join-Token, as for registration; no worker token exists yet."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from services.coordinator.deps import CoordinatorDep, JoinTokenDep
from services.coordinator.errors import error_docs
from services.coordinator.join import check_join_token
from services.coordinator.operators import OperatorCredentials
from shared.api import BOOTSTRAP_PATH, ClusterBootstrap

router = APIRouter(tags=["workers"])


@router.get(BOOTSTRAP_PATH, responses=error_docs(401, 404))
def bootstrap(coordinator: CoordinatorDep, join_token: JoinTokenDep = None) -> ClusterBootstrap:
    """401 without the cluster's join token or with a wrong one; 404 when this coordinator was started
    without RL_WEIGHTS_PUBLIC_KEY (it has nothing to hand out: workers must be configured by hand)."""
    operators = OperatorCredentials(coordinator.redis, coordinator.keys)  # an issued credential bootstraps too
    check_join_token(
        join_token, coordinator.join_token_sha256, "the cluster bootstrap", operators, coordinator.open_registration
    )
    if coordinator.bootstrap is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail="this coordinator has no RL_WEIGHTS_PUBLIC_KEY: it cannot bootstrap workers "
            "(start it with RL_WEIGHTS_PUBLIC_KEY, or configure the worker with RL_* variables)",
        )
    return coordinator.bootstrap
