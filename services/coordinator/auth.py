"""Bearer tokens: who is calling (the admin, or one worker) without storing any token in Redis.

A worker token is `<worker_id>.<random>`: the prefix names the worker it claims to be, so checking it
is one lookup of that worker's stored sha256, and a valid token used on another worker's URL can be
told apart (403) from a token that is no token at all (401). Only the sha256 is stored; comparisons
are constant-time.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from services.coordinator.worker_registry import WorkerRegistry

WORKER_ID_PREFIX = "w-"
TOKEN_SEPARATOR = "."


class InvalidTokenError(Exception):
    """The bearer token is neither the admin token nor a live token of a registered worker."""


@dataclass(frozen=True)
class AdminCaller:
    """Holder of RL_ADMIN_TOKEN."""


@dataclass(frozen=True)
class WorkerCaller:
    """Holder of the token issued to `worker_id` at registration."""

    worker_id: str


Caller = AdminCaller | WorkerCaller


def new_worker_id() -> str:
    return WORKER_ID_PREFIX + secrets.token_hex(8)


def issue_worker_token(worker_id: str) -> str:
    assert TOKEN_SEPARATOR not in worker_id, worker_id
    return worker_id + TOKEN_SEPARATOR + secrets.token_urlsafe(32)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def authenticate(token: str, registry: WorkerRegistry, admin_token_sha256: str) -> Caller:
    """Raises InvalidTokenError unless `token` is the admin token or the token of a registered worker
    (dead workers included: they still may deregister, and learn from a heartbeat that they are dead)."""
    digest = token_sha256(token)
    if secrets.compare_digest(digest, admin_token_sha256):
        return AdminCaller()
    claimed_worker_id, separator, _ = token.partition(TOKEN_SEPARATOR)
    if not separator or not claimed_worker_id.startswith(WORKER_ID_PREFIX):
        raise InvalidTokenError("the bearer token is not a token issued by this coordinator")
    stored_digest = registry.token_sha256_of(claimed_worker_id)
    if stored_digest is None or not secrets.compare_digest(digest, stored_digest):
        raise InvalidTokenError("the bearer token is invalid, or its worker deregistered")
    return WorkerCaller(claimed_worker_id)
