"""Join credentials an admin issues and revokes, and the identity quarantine sticks to.

The cluster's shared join token (RL_JOIN_TOKEN) makes every holder the same identity: a quarantined
worker registers again with it and is a new worker with a clean score. A join credential is an identity
of its own, issued per operator (or per worker) by an admin:

    issue        POST /v1/operators (admin): a new id and join token `<operator id>.<secret>`, shown once;
                 only its sha256 is stored, like a worker's token (services/coordinator/auth.py)
    provision    at the coordinator's start, each join token of RL_OPERATOR_TOKENS (made outside: compose's
                 .env, the Helm chart's Secret) becomes an issued credential unless it is one already
    identify     registration (and the bootstrap) with it in header X-RL-Join-Token: the id prefix names
                 the record, the presented token's sha256 is compared with the stored one in constant time
    quarantine   a worker registered under it is quarantined (services/coordinator/quarantine.py): its id
                 joins the credential's quarantine set; or the credential's own record is flagged
                 (services/coordinator/credential_record.py): its `quarantine_reason` is set. Either way the
                 credential is quarantined: it registers nobody (403), returning workers included, its live
                 identities lease nothing more (the lease script reads both) and are quarantined at the next
                 control pass
    release      an admin's release of that worker (POST /v1/workers/{id}/release) takes it out of the set;
                 the release of the credential (POST /v1/operators/{id}/release) clears its reason and releases
                 every worker of its set
    revoke       DELETE /v1/operators/{id} (admin): it registers nobody, ever (issue a new one to let the
                 operator back); its active and standby workers are drained (routers/operators.py)

Layout (names from `shared.keys.RunKeys`): `operator_ids` (set of ids), `operator(id)` (hash: operator_id,
name, token_sha256, created_at_s, revoked_at_s (0.0: not revoked), quarantine_reason ("" or absent: none),
and the budget fields an admin set: services/coordinator/credential_budget.py), `operator_quarantine(id)`
(set of quarantined worker ids). Keys are per run, like every record of the coordinator's.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis
from redis.typing import EncodableT

from services.coordinator.auth import TOKEN_SEPARATOR, token_sha256
from shared.api import OperatorInfo, OperatorState
from shared.bus import redis_text
from shared.keys import RunKeys

OPERATOR_ID_PREFIX = "op-"
# A join token made outside the coordinator and provisioned at its start (RL_OPERATOR_TOKENS: compose, Helm):
# an id as `issue` makes them, then a secret of 16+ URL-safe characters (no comma: the variable is a list)
PROVISIONED_TOKEN_PATTERN = r"op-[0-9a-f]{12}\.[A-Za-z0-9_-]{16,}"


class UnknownOperatorError(LookupError):
    """No join credential with this id was issued for the run."""


@dataclass(frozen=True)
class OperatorCredentials:
    """The run's join credentials in Redis; stateless, so any coordinator process may build one."""

    redis: redis.Redis
    keys: RunKeys
    clock: Callable[[], float] = field(default=time.time)  # unix seconds

    def issue(self, name: str) -> tuple[OperatorInfo, str]:
        """A new credential: its record and its join token (shown once)."""
        operator_id = OPERATOR_ID_PREFIX + secrets.token_hex(6)
        join_token = operator_id + TOKEN_SEPARATOR + secrets.token_urlsafe(32)
        fields: dict[EncodableT, EncodableT] = {
            "operator_id": operator_id,
            "name": name,
            "token_sha256": token_sha256(join_token),
            "created_at_s": repr(self.clock()),
            "revoked_at_s": "0.0",
        }
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.operator(operator_id), mapping=fields)
            pipe.sadd(self.keys.operator_ids, operator_id)
            pipe.execute()
        return self.get(operator_id), join_token

    def provision(self, join_token: str, name: str) -> bool:
        """Make sure `join_token` (made outside, PROVISIONED_TOKEN_PATTERN) is an issued credential: True when
        its record was created now, False when it already was (left as it is: revoked, quarantined or with a
        budget of an admin's). ValueError for a malformed token, or one whose id was issued with another secret:
        a record is never overwritten, since that would hand its identity (and its record) to a new holder."""
        if not re.fullmatch(PROVISIONED_TOKEN_PATTERN, join_token):
            raise ValueError(f"a provisioned join token is op-<12 hex>.<16+ URL-safe characters>, not {name}'s")
        operator_id = join_token.partition(TOKEN_SEPARATOR)[0]
        key = self.keys.operator(operator_id)
        digest = token_sha256(join_token)

        fields: dict[EncodableT, EncodableT] = {
            "operator_id": operator_id,
            "name": name,
            "token_sha256": digest,
            "created_at_s": repr(self.clock()),
            "revoked_at_s": "0.0",
        }
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)  # two coordinators starting at once: the second reads the first's record
                    stored = pipe.hget(key, "token_sha256")
                    if stored is not None:
                        if not hmac.compare_digest(redis_text(stored), digest):
                            raise ValueError(
                                f"join credential {operator_id} exists with another secret ({name} not provisioned)"
                            )
                        return False
                    pipe.multi()
                    pipe.hset(key, mapping=fields)
                    pipe.sadd(self.keys.operator_ids, operator_id)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    def identify(self, presented_join_token: str) -> OperatorInfo | None:
        """The credential `presented_join_token` is, or None when it is none of this run's (a wrong token,
        or the shared one). Revoked and quarantined ones are returned too: the caller refuses them."""
        operator_id, separator, _ = presented_join_token.partition(TOKEN_SEPARATOR)
        if not separator or not operator_id.startswith(OPERATOR_ID_PREFIX):
            return None
        stored = self.redis.hget(self.keys.operator(operator_id), "token_sha256")
        if stored is None or not hmac.compare_digest(token_sha256(presented_join_token), redis_text(stored)):
            return None
        return self.get(operator_id)

    def get(self, operator_id: str) -> OperatorInfo:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.operator(operator_id))
            pipe.smembers(self.keys.operator_quarantine(operator_id))
            raw, quarantined = pipe.execute()
        if not raw:
            raise UnknownOperatorError(f"no join credential {operator_id} was issued for this run")
        return _info(raw, quarantined)

    def ids(self) -> list[str]:
        """Every credential id issued for the run."""
        return sorted(redis_text(i) for i in self.redis.smembers(self.keys.operator_ids))

    def list_operators(self) -> list[OperatorInfo]:
        """Every credential of the run, oldest first (worker_ids left empty: the router fills them in)."""
        operator_ids = sorted(redis_text(i) for i in self.redis.smembers(self.keys.operator_ids))
        with self.redis.pipeline(transaction=False) as pipe:
            for operator_id in operator_ids:
                pipe.hgetall(self.keys.operator(operator_id))
                pipe.smembers(self.keys.operator_quarantine(operator_id))
            replies = pipe.execute()
        infos = [_info(raw, quarantined) for raw, quarantined in zip(replies[::2], replies[1::2], strict=True) if raw]
        return sorted(infos, key=lambda info: (info.created_at_s, info.operator_id))

    def quarantine(self, operator_id: str, reason: str) -> bool:
        """Quarantine the credential itself (its record, not one worker); True when it was not already."""
        key = self.keys.operator(operator_id)
        if redis_text(self.redis.hget(key, "quarantine_reason") or b""):
            return False
        self.redis.hset(key, "quarantine_reason", reason[:1000])
        return True

    def clear_reason(self, operator_id: str) -> None:
        self.redis.hdel(self.keys.operator(operator_id), "quarantine_reason")

    def revoke(self, operator_id: str) -> OperatorInfo:
        """Idempotent (a second revocation keeps the first time). Raises UnknownOperatorError."""
        before = self.get(operator_id)
        if before.revoked_at_s is None:
            self.redis.hset(self.keys.operator(operator_id), "revoked_at_s", repr(self.clock()))
        return self.get(operator_id)

    def hold(self, worker_operators: Iterable[tuple[str, str]]) -> None:
        """Quarantine sticks: each (worker id, its operator id) joins that credential's quarantine set.
        Idempotent; workers of the shared token (operator id "") have no credential to hold."""
        pairs = [(worker_id, operator_id) for worker_id, operator_id in worker_operators if operator_id]
        if not pairs:
            return
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id, operator_id in pairs:
                pipe.sadd(self.keys.operator_quarantine(operator_id), worker_id)
            pipe.execute()

    def release(self, worker_id: str) -> list[str]:
        """An admin released `worker_id`: it leaves every credential's quarantine set (the worker's record
        may be gone, so all are tried: one SREM per credential, an admin's rare call). Returns the ids of
        the credentials it was held in."""
        operator_ids = [redis_text(i) for i in self.redis.smembers(self.keys.operator_ids)]
        with self.redis.pipeline(transaction=False) as pipe:
            for operator_id in operator_ids:
                pipe.srem(self.keys.operator_quarantine(operator_id), worker_id)
            removed = pipe.execute()
        return [operator_id for operator_id, num in zip(operator_ids, removed, strict=True) if num]


def _info(raw: dict[bytes, bytes], quarantined: set[bytes]) -> OperatorInfo:
    record = {redis_text(name): redis_text(value) for name, value in raw.items()}
    revoked_at_s = float(record["revoked_at_s"])
    quarantined_ids = sorted(redis_text(worker_id) for worker_id in quarantined)
    reason = record.get("quarantine_reason") or None
    if revoked_at_s > 0:
        state = OperatorState.REVOKED
    elif quarantined_ids or reason:
        state = OperatorState.QUARANTINED
    else:
        state = OperatorState.ACTIVE
    return OperatorInfo(
        operator_id=record["operator_id"],
        name=record["name"],
        state=state,
        created_at_s=float(record["created_at_s"]),
        revoked_at_s=revoked_at_s if revoked_at_s > 0 else None,
        quarantined_worker_ids=quarantined_ids,
        quarantine_reason=reason,
    )
