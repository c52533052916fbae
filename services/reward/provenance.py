"""Is a rollout from the worker it names? The reward service's check before it scores a group.

Each group carries `producer_mac`, an HMAC-SHA256 of the group under the rollout key the coordinator
issued its `worker_id` (shared/rollout_mac.py). A group whose worker has no key (unknown id, or one
pruned long ago) or whose mac does not match is forged: it is dead-lettered with the reason
`forged rollout: ...`, never scored, and counted against the worker it names (`num_rollouts_forged` in
that worker's record, shown by GET /v1/workers and /metrics) when that worker exists. Which worker
really wrote the entry cannot be told from the stream entry (every worker appends to the one `rollouts`
stream), so the count is against the claimed id: a liar posting as another worker raises that worker's
count, and the dead letter keeps the payload for a person to look at.

Keys are cached per worker id; a mismatch under a cached key re-reads the key once, so a rotated key is
picked up.
"""

from __future__ import annotations

import logging
from typing import cast

import redis

from shared.keys import RunKeys
from shared.messages import RolloutGroup
from shared.rollout_mac import mac_matches

log = logging.getLogger(__name__)

# KEYS: the worker's record. Counts a forged rollout against a worker that exists (never creates a record).
_COUNT_FORGED_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HINCRBY', KEYS[1], 'num_rollouts_forged', 1) end
return 0
"""


class ForgedRolloutError(Exception):
    """The group's producer_mac does not prove it comes from the worker it names."""


class ProducerCheck:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.redis = client
        self.keys = keys
        self._keys_by_worker: dict[str, bytes] = {}
        self._count_forged = client.register_script(_COUNT_FORGED_LUA)
        self.num_forged = 0

    def verify(self, group: RolloutGroup) -> None:
        """Raises ForgedRolloutError (after counting it) unless `group` is signed by its worker's key."""
        reason = self._forgery(group)
        if reason is None:
            return
        self.num_forged += 1
        self._count_forged(keys=[self.keys.worker(group.worker_id)])
        raise ForgedRolloutError(f"forged rollout: {reason}")

    def _forgery(self, group: RolloutGroup) -> str | None:
        """Why the group is forged, None if it is not."""
        if not group.producer_mac:
            return f"group {group.group_id} claims worker {group.worker_id} but carries no producer_mac"
        cached = self._keys_by_worker.get(group.worker_id)
        if cached is not None and mac_matches(group, cached):
            return None
        key = self._read_key(group.worker_id)
        if key is None:
            return f"group {group.group_id} claims worker {group.worker_id}, which holds no rollout key"
        if not mac_matches(group, key):
            return f"group {group.group_id}: producer_mac does not match the key of worker {group.worker_id}"
        self._keys_by_worker[group.worker_id] = key
        return None

    def _read_key(self, worker_id: str) -> bytes | None:
        return cast(bytes | None, self.redis.get(self.keys.rollout_key(worker_id)))  # a bytes-mode client
