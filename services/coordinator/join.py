"""Who may join the run, and who is coming back.

    POST /v1/workers
      1. the join token (header X-RL-Join-Token), constant-time: the cluster's shared one (RL_JOIN_TOKEN),
         or a join credential an admin issued (services/coordinator/operators.py), whose id the worker
         carries (`WorkerInfo.operator_id`; "" for the shared token). 401 if missing or neither; 403 for
         a revoked credential, or one holding a quarantined worker (quarantine sticks to the credential
         until an admin releases that worker). Open registration (a dev setting) admits anyone, as the
         shared identity unless a credential is presented.
      2. the registration rate limits (services/coordinator/registration_limit.py): the credential's own
         bucket (its budget: services/coordinator/credential_budget.py), or, on the unauthenticated path
         (open registration, a missing or wrong join token), the client address's: 429 + Retry-After
      3. a returning worker (body `previous_worker_id`, header `Authorization: Bearer <its token>`):
         401 without the bearer token, 403 if the token is not that worker's or the join token is not
         the credential it registered with, 409 if it is quarantined or its state is not dead, active
         or standby (draining, quarantined: rejoining is no way out); else its record is revived: same
         id, same totals, a fresh lease and a new token. A previous id the coordinator no longer knows
         (pruned after `dead_worker_retention_s`, or Redis lost it) joins as a new worker: nothing is
         left to prove the identity against.
      4. anyone else is a new worker with a new id.
    Steps 3 and 4 hold the credential to its worker cap (`max_workers` live identities, in the same script as
    the registration): 429 + Retry-After while it holds that many.

A worker whose lease ran out during an outage (Redis or the coordinator down longer than the lease)
thus keeps its identity, and the dashboard counts one worker per process.

Quarantine cannot stick to the shared token: every holder is the same identity, and holding it back
would stop the whole fleet, so a worker quarantined under it can register again as a new worker with a
clean score. It is for dev and trusted fleets; untrusted operators each get a credential.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Collection
from dataclasses import dataclass

from fastapi import HTTPException, status

from services.coordinator.auth import issue_worker_token, new_worker_id, token_sha256
from services.coordinator.credential_budget import Budgets, address_rate, registration_rate
from services.coordinator.operators import OperatorCredentials
from services.coordinator.registration_limit import (
    Rate,
    RegistrationLimits,
    address_key,
    credential_key,
    retry_after_header,
)
from services.coordinator.worker_registry import (
    NO_CAP,
    REVIVE_CREDENTIAL_FULL,
    REVIVE_REFUSED,
    REVIVE_WRONG_TOKEN,
    REVIVED,
    CredentialFullError,
    WorkerRegistry,
)
from shared.api import (
    JOIN_TOKEN_HEADER,
    CredentialBudget,
    OperatorInfo,
    OperatorState,
    RegisterWorkerRequest,
    WorkerInfo,
    WorkerState,
)

log = logging.getLogger(__name__)

SHARED_IDENTITY = ""  # the operator id of workers that joined with the cluster's shared token


@dataclass(frozen=True)
class Joined:
    worker_id: str
    token: str  # shown to the worker once; only its sha256 is stored
    info: WorkerInfo
    rejoined: bool  # True: a returning worker's record was revived


@dataclass(frozen=True)
class Admission:
    operator_id: str  # the credential it registers under ("": the shared token, or anyone under open registration)
    budget: CredentialBudget


def admit_registration(
    presented_join_token: str | None,
    join_token_sha256: str | None,
    operators: OperatorCredentials,
    limits: RegistrationLimits,
    budgets: Budgets,
    client_host: str,
    open_registration: bool = False,
) -> Admission:
    """Steps 1 and 2 of the module doc: the joining identity's credential and its budget, or HTTPException 401,
    403 or 429."""
    try:
        operator_id = check_join_token(
            presented_join_token, join_token_sha256, "registration", operators, open_registration
        )
    except HTTPException as exc:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:  # guesses, at a bounded rate per address
            take_or_refuse(limits, address_key(client_host), address_rate(budgets.defaults), "from this address")
        raise
    budget = budgets.of(operator_id)
    if open_registration and presented_join_token is None:  # nobody to name but the address
        take_or_refuse(limits, address_key(client_host), address_rate(budgets.defaults), "from this address")
    else:
        credential = f"with join credential {operator_id or '(shared)'}"
        key, rate = credential_key(operator_id), registration_rate(budget)
        if presented_join_token is not None:  # verified: its floods are refused before FastAPI (refuse_early)
            limits.remember(token_sha256(presented_join_token), key, rate)
        take_or_refuse(limits, key, rate, credential)
    return Admission(operator_id, budget)


def take_or_refuse(limits: RegistrationLimits, key: str, rate: Rate, whose: str) -> None:
    """One registration from `key`'s bucket, or 429 with Retry-After."""
    wait_s = limits.take(key, rate)
    if wait_s is not None:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            detail=f"too many registrations {whose} ({rate.per_min:g} a minute): retry in {wait_s:.2f}s",
            headers={"Retry-After": retry_after_header(wait_s)},
        )


def check_join_token(
    presented_join_token: str | None,
    join_token_sha256: str | None,
    what: str,
    operators: OperatorCredentials | None = None,
    open_registration: bool = False,
) -> str:
    """Step 1 of the module doc, for registration and the bootstrap alike: the operator id of the
    credential presented ("" for the cluster's shared token, or anyone under open registration).
    HTTPException 401 unless the token is the shared one (`join_token_sha256`; None: there is none) or a
    credential of `operators`; 403 when that credential is revoked or quarantined."""
    if presented_join_token is not None:
        if join_token_sha256 is not None and hmac.compare_digest(token_sha256(presented_join_token), join_token_sha256):
            return SHARED_IDENTITY
        operator = None if operators is None else operators.identify(presented_join_token)
        if operator is not None:
            ensure_admits(operator, what)
            return operator.operator_id
    if open_registration:
        return SHARED_IDENTITY
    if presented_join_token is None:
        raise _unauthorized(f"{what} needs a join token in header {JOIN_TOKEN_HEADER}")
    raise _unauthorized(f"the join token in header {JOIN_TOKEN_HEADER} is wrong")


def ensure_admits(operator: OperatorInfo, what: str) -> None:
    """403 for a revoked credential, or a quarantined one (holding a quarantined worker, or for its record)."""
    if operator.state == OperatorState.REVOKED:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"{what} refused: join credential {operator.operator_id} was revoked by an admin",
        )
    if operator.state == OperatorState.QUARANTINED:
        why = (
            f"with its worker {', '.join(operator.quarantined_worker_ids)}"
            if operator.quarantined_worker_ids
            else f"for its record: {operator.quarantine_reason}"
        )
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"{what} refused: join credential {operator.operator_id} is quarantined {why}; an admin must "
            f"release it (POST /v1/operators/{operator.operator_id}/release)",
        )


def join_or_rejoin(
    registry: WorkerRegistry,
    request: RegisterWorkerRequest,
    bearer_token: str | None,
    state: WorkerState,
    quarantined: Collection[str] = (),
    operator_id: str = SHARED_IDENTITY,
    max_live: int = NO_CAP,
) -> Joined:
    """Steps 3 and 4 of the module doc: revive a returning worker or register a new one under
    `operator_id` (401/403 on a returning worker's bad credentials; 409 for one in `quarantined`, which
    its lease running out does not release: services/coordinator/quarantine.py; 429 while the credential
    holds `max_live` live identities)."""
    previous = request.previous_worker_id
    if previous is not None:
        if bearer_token is None:
            raise _unauthorized(f"rejoining as {previous} needs 'Authorization: Bearer <its previous token>'")
        stored = registry.token_sha256_of(previous)
        if stored is not None:
            presented = token_sha256(bearer_token)
            if not hmac.compare_digest(presented, stored):
                raise _forbidden(previous)
            if (registered_under := registry.operator_of(previous)) != operator_id:
                raise HTTPException(
                    status.HTTP_403_FORBIDDEN,
                    detail=f"worker {previous} registered with join credential {registered_under or '(shared)'}, "
                    f"not {operator_id or '(shared)'}: a worker keeps its identity",
                )
            if previous in quarantined:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    detail=f"worker {previous} is quarantined: an admin must release it (POST /v1/workers/{previous}/release)",
                )
            token = issue_worker_token(previous)
            outcome = registry.revive(previous, request, presented, token_sha256(token), state, max_live)
            if outcome == REVIVED:
                log.info("worker %s rejoined (same id, totals kept)", previous)
                return Joined(previous, token, registry.get(previous), rejoined=True)
            if outcome == REVIVE_WRONG_TOKEN:  # its token changed between the check and the script
                raise _forbidden(previous)
            if outcome == REVIVE_CREDENTIAL_FULL:
                raise _credential_full(operator_id, max_live, registry.lease_s)
            if outcome == REVIVE_REFUSED:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    detail=f"worker {previous} is {registry.get(previous).state.value}: rejoining does not change that",
                )
        log.info("worker %s is no longer known (pruned or lost): it joins under a new id", previous)
    worker_id = new_worker_id()
    token = issue_worker_token(worker_id)
    try:
        info = registry.register(
            worker_id, request, token_sha256(token), state=state, operator_id=operator_id, max_live=max_live
        )
    except CredentialFullError as exc:
        raise _credential_full(operator_id, max_live, registry.lease_s) from exc
    return Joined(worker_id, token, info, rejoined=False)


def _credential_full(operator_id: str, max_live: int, lease_s: float) -> HTTPException:
    """429: the credential holds its cap of live identities; one of them may die within a lease."""
    return HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        detail=f"join credential {operator_id or '(shared)'} holds {max_live} live workers, its cap: register again "
        "when one of them leaves or dies, or ask an admin to raise it (relay-rl operators budget)",
        headers={"Retry-After": retry_after_header(lease_s)},
    )


def _unauthorized(reason: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=reason, headers={"WWW-Authenticate": "Bearer"})


def _forbidden(worker_id: str) -> HTTPException:
    return HTTPException(status.HTTP_403_FORBIDDEN, detail=f"the bearer token is not worker {worker_id}'s token")
