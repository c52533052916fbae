"""A redis-server of a test's own with ACLs on, as the local runner starts it: the default user off, one
user per trusted service (cluster/redis_acl.py). The `acl_redis` fixture (tests/integration/conftest.py)
is the usual way in."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from cluster.redis_acl import OPERATOR, RedisUsers
from cluster.redis_server import RedisServer
from shared.bus import connect
from shared.keys import RunKeys


@dataclass(frozen=True)
class AclRedis:
    server: RedisServer
    users: RedisUsers
    keys: RunKeys

    def client_of(self, user: str) -> redis.Redis:
        return connect(self.users.url_for(user, self.server.url))


@contextlib.contextmanager
def acl_redis_server(tmp_path: Path) -> Iterator[AclRedis]:
    """A redis-server of its own with the local cluster's ACL file (the default user off), for a fresh run id."""
    run_id = f"test-{uuid.uuid4().hex[:10]}"
    users = RedisUsers(run_id)
    acl_file = tmp_path / "users.acl"
    users.write_acl_file(acl_file)
    server = RedisServer(tmp_path / "redis", acl_file=acl_file, probe_user=(OPERATOR, users.passwords[OPERATOR]))
    server.start()
    try:
        yield AclRedis(server, users, RunKeys(run_id))
    finally:
        server.stop()
