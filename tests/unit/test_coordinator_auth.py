"""Worker ids and tokens: their shape, and which tokens are rejected before Redis is asked."""

from __future__ import annotations

import re

import pytest
import redis

from services.coordinator.auth import (
    AdminCaller,
    InvalidTokenError,
    authenticate,
    issue_worker_token,
    new_worker_id,
    token_sha256,
)
from services.coordinator.worker_registry import WorkerRegistry
from shared.keys import RunKeys

ADMIN_TOKEN = "admin-token-0123456789"


@pytest.fixture
def offline_registry() -> WorkerRegistry:
    """A registry whose Redis does not exist: any test that reaches it fails with a connection error."""
    return WorkerRegistry(redis.Redis(port=1, socket_connect_timeout=0.1), RunKeys("unit"), lease_s=5.0)


def test_worker_ids_and_tokens_are_random_and_name_their_worker() -> None:
    worker_ids = {new_worker_id() for _ in range(100)}
    assert len(worker_ids) == 100
    assert all(re.fullmatch(r"w-[0-9a-f]{16}", worker_id) for worker_id in worker_ids)
    worker_id = new_worker_id()
    first, second = issue_worker_token(worker_id), issue_worker_token(worker_id)
    assert first != second
    assert first.startswith(worker_id + ".") and len(first) > len(worker_id) + 40


def test_token_digest_is_hex_sha256() -> None:
    assert token_sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_admin_token_authenticates_as_admin(offline_registry: WorkerRegistry) -> None:
    assert authenticate(ADMIN_TOKEN, offline_registry, token_sha256(ADMIN_TOKEN)) == AdminCaller()


@pytest.mark.parametrize("token", ["", "garbage", "no-separator-here", "x-123.secret", ".secret"])
def test_tokens_not_issued_by_the_coordinator_are_rejected(offline_registry: WorkerRegistry, token: str) -> None:
    with pytest.raises(InvalidTokenError):
        authenticate(token, offline_registry, token_sha256(ADMIN_TOKEN))
