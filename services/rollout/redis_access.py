"""The worker's Redis connection, made from what registration issued (shared/api.py WorkerAccess).

With Redis ACLs on, the coordinator answers a registration with this worker's own Redis user, its password
and the URL to use; the worker opens no Redis connection before it has them. A re-registration issues a
new password (and, for a new id, a new user): `IssuedCredentials` hands redis-py the latest ones every
time it opens a connection, so the client needs no rebuilding when the coordinator kills the old
connections. With ACLs off the registration carries no user and the worker's own RL_REDIS_URL is used.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from redis.credentials import CredentialProvider

from shared.api import WorkerAccess
from shared.bus import connect
from shared.redis_urls import without_credentials


class IssuedCredentials(CredentialProvider):
    """The Redis user and password of the worker's current registration (redis-py asks on every connect)."""

    def __init__(self, current: Callable[[], WorkerAccess]) -> None:
        self.current = current

    def get_credentials(self) -> tuple[str, str]:
        access = self.current()
        if access.redis_username is None or access.redis_password is None:
            raise ValueError("this registration issued no Redis user")
        return access.redis_username, access.redis_password


def connect_as_worker(access: WorkerAccess, current: Callable[[], WorkerAccess], own_url: str) -> redis.Redis | None:
    """A client logged in with the issued user (credentials from `current()` at each connect), on the issued
    URL (else `own_url`); None when the registration issued no user (ACLs off: keep the client you have)."""
    if access.redis_username is None:
        return None
    url = without_credentials(access.redis_url or own_url)  # the user comes from the provider, never the URL
    return connect(url, credential_provider=IssuedCredentials(current))
