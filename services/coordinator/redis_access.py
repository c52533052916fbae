"""What a worker is issued at registration, and revoked when it leaves: its rollout-signing key.

Workers hold no Redis credentials: the coordinator's work API (services/coordinator/work_leases.py) does
every stream operation on their behalf. What remains per worker is the key it signs its rollouts with
(shared/rollout_mac.py), stored under `RunKeys.rollout_key(id)` for the reward service, which verifies
every rollout against it; only trusted services read it.

Revocation (`revoke_worker_access`): the key expires after a retention period (groups the worker
answered before it left are still verified meanwhile). It happens on deregistration and on quarantine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import redis

from shared.api import WorkerAccess
from shared.keys import RunKeys
from shared.rollout_mac import new_rollout_key

DEFAULT_ROLLOUT_KEY_RETENTION_S = 86_400  # a worker's rollouts may wait this long for the reward service


@dataclass(frozen=True)
class RedisAccess:
    """Issues and revokes workers' rollout-signing keys for one run."""

    redis: redis.Redis
    keys: RunKeys

    def grant(self, worker_id: str) -> WorkerAccess:
        """A worker re-registering under the same id keeps its rollout key (its groups in flight still verify)."""
        key_name = self.keys.rollout_key(worker_id)
        self.redis.set(key_name, new_rollout_key(), nx=True)
        self.redis.persist(key_name)
        rollout_key = cast(bytes, self.redis.get(key_name))  # a bytes-mode client; just set if it was missing
        return WorkerAccess(rollout_key_hex=rollout_key.hex())

    def revoke(self, worker_id: str) -> None:
        revoke_worker_access(self.redis, self.keys, worker_id)


def revoke_worker_access(client: redis.Redis, keys: RunKeys, worker_id: str) -> None:
    """Let the worker's rollout key expire after DEFAULT_ROLLOUT_KEY_RETENTION_S. Idempotent. The quarantine path
    calls this."""
    client.expire(keys.rollout_key(worker_id), DEFAULT_ROLLOUT_KEY_RETENTION_S)
