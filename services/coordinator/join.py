"""Who may join the run, and who is coming back.

    POST /v1/workers
      1. the join token (header X-RL-Join-Token) against the cluster's, constant-time: 401 if missing
         or wrong (skipped when the coordinator runs with open registration, a dev setting)
      2. the registration rate limit (services/coordinator/registration_limit.py): 429 + Retry-After
      3. a returning worker (body `previous_worker_id`, header `Authorization: Bearer <its token>`):
         401 without the bearer token, 403 if the token is not that worker's, 409 if it is
         quarantined or its state is not dead, active or standby (draining, quarantined: rejoining is
         no way out); else its record is revived: same id, same totals, a fresh lease and a new token. A previous id the coordinator
         no longer knows (pruned after `dead_worker_retention_s`, or Redis lost it) joins as a new
         worker: nothing is left to prove the identity against.
      4. anyone else is a new worker with a new id.

A worker whose lease ran out during an outage (Redis or the coordinator down longer than the lease)
thus keeps its identity, and the dashboard counts one worker per process.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Collection
from dataclasses import dataclass

from fastapi import HTTPException, status

from services.coordinator.auth import issue_worker_token, new_worker_id, token_sha256
from services.coordinator.registration_limit import RegistrationLimit, retry_after_header
from services.coordinator.worker_registry import REVIVE_REFUSED, REVIVE_WRONG_TOKEN, REVIVED, WorkerRegistry
from shared.api import JOIN_TOKEN_HEADER, RegisterWorkerRequest, WorkerInfo, WorkerState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Joined:
    worker_id: str
    token: str  # shown to the worker once; only its sha256 is stored
    info: WorkerInfo
    rejoined: bool  # True: a returning worker's record was revived


def admit_registration(
    presented_join_token: str | None, join_token_sha256: str | None, limit: RegistrationLimit
) -> None:
    """Steps 1 and 2 of the module doc: raises HTTPException 401 or 429."""
    check_join_token(presented_join_token, join_token_sha256, "registration")
    wait_s = limit.take()
    if wait_s is not None:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            detail=f"too many registrations: retry in {wait_s:.2f}s",
            headers={"Retry-After": retry_after_header(wait_s)},
        )


def check_join_token(presented_join_token: str | None, join_token_sha256: str | None, what: str) -> None:
    """Step 1 of the module doc, for registration and the bootstrap alike: HTTPException 401 unless the
    presented token is the cluster's (constant-time), or registration is open (`join_token_sha256` None)."""
    if join_token_sha256 is None:
        return
    if presented_join_token is None:
        raise _unauthorized(f"{what} needs the cluster's join token in header {JOIN_TOKEN_HEADER}")
    if not hmac.compare_digest(token_sha256(presented_join_token), join_token_sha256):
        raise _unauthorized(f"the join token in header {JOIN_TOKEN_HEADER} is wrong")


def join_or_rejoin(
    registry: WorkerRegistry,
    request: RegisterWorkerRequest,
    bearer_token: str | None,
    state: WorkerState,
    quarantined: Collection[str] = (),
) -> Joined:
    """Steps 3 and 4 of the module doc: revive a returning worker or register a new one (401/403 on a
    returning worker's bad credentials; 409 for one in `quarantined`, which its lease running out does
    not release: services/coordinator/quarantine.py)."""
    previous = request.previous_worker_id
    if previous is not None:
        if bearer_token is None:
            raise _unauthorized(f"rejoining as {previous} needs 'Authorization: Bearer <its previous token>'")
        stored = registry.token_sha256_of(previous)
        if stored is not None:
            presented = token_sha256(bearer_token)
            if not hmac.compare_digest(presented, stored):
                raise _forbidden(previous)
            if previous in quarantined:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    detail=f"worker {previous} is quarantined: an admin must release it (POST /v1/workers/{previous}/release)",
                )
            token = issue_worker_token(previous)
            outcome = registry.revive(previous, request, presented, token_sha256(token), state)
            if outcome == REVIVED:
                log.info("worker %s rejoined (same id, totals kept)", previous)
                return Joined(previous, token, registry.get(previous), rejoined=True)
            if outcome == REVIVE_WRONG_TOKEN:  # its token changed between the check and the script
                raise _forbidden(previous)
            if outcome == REVIVE_REFUSED:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    detail=f"worker {previous} is {registry.get(previous).state.value}: rejoining does not change that",
                )
        log.info("worker %s is no longer known (pruned or lost): it joins under a new id", previous)
    worker_id = new_worker_id()
    token = issue_worker_token(worker_id)
    info = registry.register(worker_id, request, token_sha256(token), state=state)
    return Joined(worker_id, token, info, rejoined=False)


def _unauthorized(reason: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=reason, headers={"WWW-Authenticate": "Bearer"})


def _forbidden(worker_id: str) -> HTTPException:
    return HTTPException(status.HTTP_403_FORBIDDEN, detail=f"the bearer token is not worker {worker_id}'s token")
