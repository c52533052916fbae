"""What a worker may do on Redis, granted at registration and revoked when it leaves.

Every worker gets, at registration:
- a rollout-signing key (shared/rollout_mac.py), stored under `RunKeys.rollout_key(id)` for the reward
  service, which verifies every rollout against it;
- with ACLs on (`RL_REDIS_ACL=true`), its own Redis ACL user `rl:<run_id>:worker:<id>` with a random
  password, allowed exactly the commands the worker's code issues (shared/bus.py) on the keys it needs
  (`worker_acl_rules`): read, claim and ack `tasks`; append to `rollouts` and `dead`; range-read
  `weights`. No other key (not `scored`, not the learner's state, not the coordinator's records, not the
  rollout keys), no admin command. The coordinator's own Redis user needs `+acl` and `+client|kill`.

Revocation (`revoke_worker_access`): the user is deleted, its open connections are killed (a connection
stays authenticated after its user is deleted otherwise), and the rollout key expires after a retention
period (groups the worker published before it left are still verified meanwhile). It happens on
deregistration (which a drained worker does once its last batch is acked), on lease expiry and after
`drain_grace_s` of draining (the sweeper reconciles the run's users with the live leases every tick, so
expiry by any path, even one marked while this coordinator was down, is covered), and on quarantine
(call `revoke_worker_access`). A draining worker keeps its access for the grace period because it must
still publish and ack the batch in hand.

Users are saved with ACL SAVE when Redis runs with an ACL file, so they survive a Redis restart (AOF does
not hold users); without one, a warning says a restarted Redis forgets them.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import cast

import redis

from shared.api import WorkerAccess
from shared.keys import RunKeys
from shared.redis_urls import without_credentials
from shared.retry import REDIS_OUTAGE_ERRORS
from shared.rollout_mac import new_rollout_key
from shared.streams import DEAD, ROLLOUTS, TASKS, WEIGHTS

log = logging.getLogger(__name__)

DEFAULT_ROLLOUT_KEY_RETENTION_S = 86_400  # a worker's rollouts may wait this long for the reward service
DEFAULT_DRAIN_GRACE_S = 300.0  # a draining worker finishes its batch and deregisters within this
_NO_ACL_FILE = "not configured to use an ACL file"
_warned_no_acl_file = False


def worker_acl_rules(keys: RunKeys) -> list[str]:
    """ACL SETUSER rules of a worker, after `reset on >password`. Redis 7 selectors pair commands with keys:
    a command runs only if one selector allows both it and every key it touches. The commands are those
    shared/bus.py issues for the worker (claim_stale: XAUTOCLAIM + XPENDING; publish_and_ack and
    dead letters: MULTI/XADD/XACK/EXEC; the weight watcher: XREVRANGE, XREAD BLOCK)."""
    tasks, rollouts, weights, dead = (keys.name_of(s) for s in (TASKS, ROLLOUTS, WEIGHTS, DEAD))
    return [
        "resetchannels",
        "-@all",
        "+multi",
        "+exec",
        "+discard",
        "+ping",
        f"(~{tasks} +xreadgroup +xack +xautoclaim +xpending +xgroup|create)",
        f"(~{rollouts} +xadd)",
        f"(%R~{weights} +xrevrange +xrange +xread)",
        f"(%W~{dead} +xadd)",  # append only: a worker cannot read or delete dead letters
    ]


@dataclass(frozen=True)
class RedisAccess:
    """Grants and revokes workers' access for one run. `acl`: create per-worker ACL users (Redis must run
    with its default user disabled for this to mean anything); `worker_redis_url`: the credential-free
    URL workers are told to use (None: they use their own RL_REDIS_URL)."""

    redis: redis.Redis
    keys: RunKeys
    acl: bool = False
    worker_redis_url: str | None = None
    rollout_key_retention_s: int = DEFAULT_ROLLOUT_KEY_RETENTION_S
    drain_grace_s: float = DEFAULT_DRAIN_GRACE_S

    def grant(self, worker_id: str) -> WorkerAccess:
        """Call after the registry holds the worker's lease (the reconciler deletes users without one).
        A worker re-registering under the same id keeps its rollout key (its groups in flight still verify)
        and gets a new password."""
        key_name = self.keys.rollout_key(worker_id)
        self.redis.set(key_name, new_rollout_key(), nx=True)
        self.redis.persist(key_name)
        rollout_key = cast(bytes, self.redis.get(key_name))  # a bytes-mode client; just set if it was missing
        if not self.acl:
            return WorkerAccess(rollout_key_hex=rollout_key.hex())
        username = self.keys.worker_redis_user(worker_id)
        password = secrets.token_urlsafe(32)
        self.redis.execute_command(
            "ACL", "SETUSER", username, "reset", "on", f">{password}", *worker_acl_rules(self.keys)
        )
        self._save_users()
        return WorkerAccess(
            rollout_key_hex=rollout_key.hex(),
            redis_url=self.worker_redis_url,
            redis_username=username,
            redis_password=password,
        )

    def revoke(self, worker_id: str) -> None:
        revoke_worker_access(self.redis, self.keys, worker_id, acl=self.acl, retention_s=self.rollout_key_retention_s)

    def revoke_gone(self, now_s: float) -> list[str]:
        """Revoke every worker of this run that holds a Redis user but no live lease, or has been draining
        for more than `drain_grace_s` (an honest one has deregistered by then); returns their ids. The
        users are read before the leases: a user is created after its lease, so it is seen live."""
        if not self.acl:
            return []
        prefix = self.keys.worker_redis_user("")
        users = [_text(name) for name in self.redis.execute_command("ACL", "USERS")]
        holders = [name[len(prefix) :] for name in users if name.startswith(prefix)]
        live = {_text(worker_id) for worker_id in self.redis.zrange(self.keys.worker_leases, 0, -1)}
        gone = [worker_id for worker_id in holders if worker_id not in live or self._drained(worker_id, now_s)]
        for worker_id in gone:
            self.revoke(worker_id)
            log.info("revoked the Redis access of %s: no live lease, or draining too long", worker_id)
        return gone

    def _drained(self, worker_id: str, now_s: float) -> bool:
        state, since_s = self.redis.hmget(self.keys.worker(worker_id), ["state", "state_since_s"])
        if state is None or _text(state) != "draining" or since_s is None:
            return False
        return now_s - float(_text(since_s)) > self.drain_grace_s

    def _save_users(self) -> None:
        save_acl_users(self.redis)


def revoke_worker_access(
    client: redis.Redis,
    keys: RunKeys,
    worker_id: str,
    *,
    acl: bool = True,
    retention_s: int = DEFAULT_ROLLOUT_KEY_RETENTION_S,
) -> None:
    """Delete the worker's Redis user and kill its connections (with `acl`), and let its rollout key expire
    after `retention_s`. Idempotent. The quarantine path calls this."""
    client.expire(keys.rollout_key(worker_id), retention_s)
    if not acl:
        return
    username = keys.worker_redis_user(worker_id)
    if client.execute_command("ACL", "DELUSER", username):
        save_acl_users(client)
    # after DELUSER: a connection that authenticated just before is killed, and none can authenticate after
    try:
        client.execute_command("CLIENT", "KILL", "USER", username)
    except redis.ResponseError as exc:
        if "No such user" not in str(exc):
            raise


class AclSetupError(RuntimeError):
    """RL_REDIS_ACL is on but the coordinator's Redis user cannot manage users."""


def check_acl_setup(client: redis.Redis, redis_url: str) -> bool:
    """At start, with RL_REDIS_ACL on: raises AclSetupError unless the coordinator's user may list users
    (and so, with the rules of cluster/redis_acl.py, create and delete them); warns and returns False when
    Redis still lets a connection without credentials in (its default user is on: workers' users then
    restrict nothing, since any worker can log in as the default user). `redis_url`: the coordinator's."""
    try:
        client.execute_command("ACL", "USERS")
    except REDIS_OUTAGE_ERRORS as exc:  # Redis not up yet: registration will tell, this check is a courtesy
        log.warning("could not check the Redis ACL setup: %s", exc)
        return False
    except redis.ResponseError as exc:
        raise AclSetupError(
            f"RL_REDIS_ACL=true but the coordinator's Redis user cannot manage users ({exc}); it needs "
            "+acl|setuser +acl|deluser +acl|users +acl|save +client|kill (cluster/redis_acl.py)"
        ) from exc
    anonymous = redis.Redis.from_url(without_credentials(redis_url), socket_timeout=5.0)
    try:
        anonymous.ping()
    except redis.AuthenticationError:
        return True
    except REDIS_OUTAGE_ERRORS as exc:
        log.warning("could not check the Redis ACL setup: %s", exc)
        return False
    finally:
        anonymous.close()
    log.warning("RL_REDIS_ACL=true but Redis accepts connections without credentials: disable its default user")
    return False


def save_acl_users(client: redis.Redis) -> None:
    """ACL SAVE, so users survive a Redis restart; a Redis without an ACL file is warned about, not an error."""
    try:
        client.execute_command("ACL", "SAVE")
    except redis.ResponseError as exc:
        if _NO_ACL_FILE not in str(exc):
            raise
        global _warned_no_acl_file
        if not _warned_no_acl_file:
            log.warning(
                "Redis has no ACL file: a restarted Redis forgets the workers' users (they must register again)"
            )
            _warned_no_acl_file = True


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
