"""Worker membership and leases, all in Redis so any coordinator process (or a restarted one) sees the same set.

Layout (names from `shared.keys.RunKeys`):
- `worker(id)`: hash with the worker's record (the fields of `WorkerRecord`, values as strings)
- `worker_ids`: set of every registered id, alive or dead
- `worker_leases`: sorted set id -> lease expiry (unix seconds); only live workers are in it
- `worker_dead`: sorted set id -> when its lease ran out; only dead workers are in it
- `credential_live(credential id)`: set of the credential's live identities (its worker cap counts them)

A worker is DEAD once `now >= lease expiry`. Expiry is applied lazily by every read and by the
coordinator's sweeper; both go through `expire_due`. The check-and-mark steps run as Lua scripts so a
heartbeat racing the sweeper either extends a live lease or finds the worker dead, never both.

Readers of the live fleet (the control loop, status, the relay plan) read `worker_leases`' members only,
and the dead are read from `worker_dead` newest first and a page at a time: thousands of dead identities
(a registration flood) cost Redis memory until they are pruned, and no reader's time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from enum import Enum

import redis
from pydantic import TypeAdapter, ValidationError
from redis.typing import EncodableT

from services.coordinator.announcements import Announcements, IgnoredSwaps
from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.heartbeat_batch import (
    DEAD,
    HEARTBEAT_LUA,
    UNKNOWN,
    HeartbeatEntry,
    parse_outcomes,
    script_arguments,
)
from services.coordinator.liveness_lua import MARK_DEAD_LUA
from services.coordinator.measurements import (
    BAD_MEASUREMENTS,
    WORKER_INT_FIELDS,
    WORKER_NUMBER_FIELDS,
    sanitize_worker_record,
)
from shared.api import HeartbeatRequest, RegisterWorkerRequest, WorkerInfo, WorkerState
from shared.bus import redis_text
from shared.keys import RunKeys


class UnknownWorkerError(LookupError):
    """No worker with this id is registered (never was, or it deregistered)."""


class WorkerDeadError(Exception):
    """The worker's lease expired; it must register again."""


class CredentialFullError(Exception):
    """The join credential already holds its cap of live identities ([credentials] max_workers, or what an
    admin set for it): a registration waits until one of them leaves or dies."""


class WorkerRecord(WorkerInfo):
    """What the hash holds: the public info plus the sha256 of the worker's token (never the token)."""

    token_sha256: str

    def public(self) -> WorkerInfo:
        return WorkerInfo.model_validate(self.model_dump(exclude={"token_sha256"}))


# KEYS: worker hash, leases, dead. ARGV: worker id, now_s, credential key prefix. Marks the worker dead if its
# lease is still due. Returns 1 when it did.
_EXPIRE_LUA = (
    MARK_DEAD_LUA
    + """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if (not expiry) or tonumber(expiry) > tonumber(ARGV[2]) then return 0 end
mark_dead(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[1], expiry)
return 1
"""
)

# The credential's worker cap, checked and applied with the registration in one step (a flood of concurrent
# registrations cannot all pass the check). Members of the live set whose lease ran out are marked dead first.
# Used by _REGISTER_LUA and _REVIVE_LUA: room_for(live set, leases, dead, credential prefix, worker key prefix,
# worker id, now_s, max live) -> true when the worker may be live now (it already is, or the set has room).
_ROOM_FOR_LUA = (
    MARK_DEAD_LUA
    + """
local function room_for(live, leases, dead, credential_prefix, worker_prefix, worker_id, now_s, max_live)
  if redis.call('SISMEMBER', live, worker_id) == 1 then return true end
  if redis.call('SCARD', live) < max_live then return true end
  for _, member in ipairs(redis.call('SMEMBERS', live)) do
    local expiry = redis.call('ZSCORE', leases, member)
    if (not expiry) or tonumber(expiry) <= now_s then
      mark_dead(worker_prefix .. member, leases, dead, credential_prefix, member, expiry or now_s)
      redis.call('SREM', live, member)  -- a member with no record left the set too
    end
  end
  return redis.call('SCARD', live) < max_live
end
"""
)

# KEYS: worker hash, leases, worker ids, the credential's live set, dead. ARGV: worker id, now_s, expiry_s,
# max live identities of the credential, credential key prefix, worker key prefix, then (field, value) pairs of
# the record. Returns 1 registered, 0 refused: the credential holds its cap of live identities.
_REGISTER_LUA = (
    _ROOM_FOR_LUA
    + """
if not room_for(KEYS[4], KEYS[2], KEYS[5], ARGV[5], ARGV[6], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])) then
  return 0
end
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""
)


# KEYS: worker hash. ARGV: new state, now_s, then the states it may change from. Returns the state after
# the call ('' when the worker is unknown): the new one, or the current one when that is not allowed.
_SET_STATE_LUA = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return '' end
if state == ARGV[1] then return state end
for i = 3, #ARGV do
  if state == ARGV[i] then
    redis.call('HSET', KEYS[1], 'state', ARGV[1], 'state_since_s', ARGV[2])
    return ARGV[1]
  end
end
return state
"""


# ARGV: the worker hash key prefix, then worker ids. Returns a JSON array of their records (values as
# stored: strings), the token digest left out. Workers deregistered meanwhile have no hash: skipped.
# (It reads keys it is not given: fine on one Redis, not on a cluster.) Called with LIST_CHUNK ids at a
# time, so Redis is never blocked for long (~3 ms per call).
_LIST_LUA = """
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local flat = redis.call('HGETALL', ARGV[1] .. id)
  if #flat > 0 then
    local record = {}
    for i = 1, #flat, 2 do
      if flat[i] ~= 'token_sha256' then record[flat[i]] = flat[i + 1] end
    end
    out[#out + 1] = record
  end
end
return cjson.encode(out)
"""

# KEYS: worker hash, leases, worker ids, dead. ARGV: worker id, the presented token's sha256, now_s, expiry_s,
# state, the new token's sha256, max live identities of its credential, credential key prefix, worker key
# prefix, then (field, value) pairs of the registration. Revives a known worker whose stored token digest is
# the presented one, if it is dead, active or standby (any other state, e.g. one an operator or the trust
# score put it in, is not the worker's to leave by rejoining), and its credential has room for it.
# Returns 1 revived, 0 unknown, -1 wrong token, -2 not revivable in its state, -3 its credential is full.
_REVIVE_LUA = (
    _ROOM_FOR_LUA
    + """
local digest = redis.call('HGET', KEYS[1], 'token_sha256')
if not digest then return 0 end
if digest ~= ARGV[2] then return -1 end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'dead' and state ~= 'active' and state ~= 'standby' then return -2 end
local live = ARGV[8] .. (redis.call('HGET', KEYS[1], 'operator_id') or '') .. ':live'
if not room_for(live, KEYS[2], KEYS[4], ARGV[8], ARGV[9], ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[7])) then
  return -3
end
redis.call('HSET', KEYS[1], 'state', ARGV[5], 'state_since_s', ARGV[3], 'last_heartbeat_s', ARGV[3],
  'lease_expires_at_s', ARGV[4], 'token_sha256', ARGV[6])
redis.call('HDEL', KEYS[1], 'inbound_reachable')  -- probed again (reachability.py): it may be elsewhere now
for i = 10, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', live, ARGV[1])
return 1
"""
)
REVIVED, REVIVE_UNKNOWN, REVIVE_WRONG_TOKEN, REVIVE_REFUSED, REVIVE_CREDENTIAL_FULL = 1, 0, -1, -2, -3
NO_CAP = 2**31  # max_live when a caller sets none (tests, tools writing records directly)

# KEYS: worker hash, leases, worker ids, dead. ARGV: worker id, credential key prefix. Forgets a worker (a
# deregistration): its record and its place in every set. Returns 1 when it was known.
_FORGET_LUA = """
local known = redis.call('EXISTS', KEYS[1])
local credential = redis.call('HGET', KEYS[1], 'operator_id') or ''
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('SREM', ARGV[2] .. credential .. ':live', ARGV[1])
return known
"""
_WORKER_LIST = TypeAdapter(list[WorkerInfo])
LIST_CHUNK = 100  # workers per script call: Redis serves no heartbeat while one runs (~5 ms each)


class WorkerRegistry:
    def __init__(
        self, client: redis.Redis, keys: RunKeys, *, lease_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.redis = client
        self.keys = keys
        self.lease_s = lease_s
        self.clock = clock  # unix seconds; every coordinator sharing a Redis must agree on it roughly
        self._heartbeat_script = client.register_script(HEARTBEAT_LUA)
        self._expire_script = client.register_script(_EXPIRE_LUA)
        self._set_state_script = client.register_script(_SET_STATE_LUA)
        self._list_script = client.register_script(_LIST_LUA)
        self._revive_script = client.register_script(_REVIVE_LUA)
        self._register_script = client.register_script(_REGISTER_LUA)
        self._forget_script = client.register_script(_FORGET_LUA)
        self.announcements = Announcements(client, keys)  # the versions a swap report may name
        self.ignored_swaps = IgnoredSwaps()  # this coordinator's ignored swap reports, both heartbeat paths

    # writing
    def register(
        self,
        worker_id: str,
        request: RegisterWorkerRequest,
        token_sha256: str,
        state: WorkerState = WorkerState.ACTIVE,
        operator_id: str = "",
        max_live: int = NO_CAP,
    ) -> WorkerInfo:
        """A new worker's record and lease. `operator_id`: the join credential it registered with ("": the
        shared token; services/coordinator/operators.py), fixed for the record's life. Raises
        CredentialFullError when that credential already holds `max_live` live identities."""
        now_s = self.clock()
        record = WorkerRecord(
            worker_id=worker_id,
            state=state,
            state_since_s=now_s,
            policy_version=-1,
            num_groups_done=0,
            num_samples_done=0,
            samples_per_s=0.0,
            generating=False,
            registered_at_s=now_s,
            last_heartbeat_s=now_s,
            lease_expires_at_s=now_s + self.lease_s,
            token_sha256=token_sha256,
            operator_id=operator_id,
            **request.model_dump(exclude={"previous_worker_id"}),
        )
        k = self.keys
        args: list[EncodableT] = [worker_id, repr(now_s), repr(record.lease_expires_at_s), max_live]
        args += [k.credential_prefix, k.worker(""), *_flat(_to_redis_fields(record.model_dump()))]
        registered = self._register_script(
            keys=[k.worker(worker_id), k.worker_leases, k.worker_ids, k.credential_live(operator_id), k.worker_dead],
            args=args,
        )
        if not int(registered):
            raise CredentialFullError(
                f"join credential {operator_id or '(shared)'} holds {max_live} live workers, its cap: register again "
                "when one of them leaves, or ask an admin to raise it"
            )
        return record.public()

    def revive(
        self,
        worker_id: str,
        request: RegisterWorkerRequest,
        presented_token_sha256: str,
        new_token_sha256: str,
        state: WorkerState = WorkerState.ACTIVE,
        max_live: int = NO_CAP,
    ) -> int:
        """A returning worker (its lease ran out, or the coordinator lost it for a while) takes its own
        record back: same id, same totals and registration time; a fresh lease, `state`, the new token's
        digest and the registration's fields; its reachability unknown until probed again
        (services/coordinator/reachability.py). Checked and applied in one script, so the presented token
        is the one stored at that moment. Returns REVIVED, REVIVE_UNKNOWN (no such record: pruned or
        never known), REVIVE_WRONG_TOKEN, REVIVE_REFUSED (its state is not dead, active or standby) or
        REVIVE_CREDENTIAL_FULL (its credential holds `max_live` other live identities)."""
        now_s = self.clock()
        k = self.keys
        fields = _to_redis_fields(request.model_dump(exclude={"previous_worker_id"}))
        args: list[EncodableT] = [worker_id, presented_token_sha256, repr(now_s), repr(now_s + self.lease_s)]
        args += [state.value, new_token_sha256, max_live, k.credential_prefix, k.worker(""), *_flat(fields)]
        outcome = self._revive_script(
            keys=[k.worker(worker_id), k.worker_leases, k.worker_ids, k.worker_dead], args=args
        )
        return int(outcome)

    def heartbeat(self, worker_id: str, request: HeartbeatRequest) -> WorkerInfo:
        """Extend the lease by `lease_s` and record what the worker reports. Raises UnknownWorkerError or
        WorkerDeadError (the lease had expired: the worker must register again)."""
        self.extend_lease(worker_id, request)
        return self.get(worker_id)

    def extend_lease(self, worker_id: str, request: HeartbeatRequest) -> tuple[WorkerState, float]:
        """`heartbeat` without reading the record back: one call of the heartbeat script
        (services/coordinator/heartbeat_batch.py), which also records a reported weight swap; a swap
        reported for the first time may complete a version's T_bcast. Returns (state, new lease expiry)."""
        now_s = self.clock()
        entry = HeartbeatEntry(
            worker_id=worker_id,
            token_sha256="",
            now_s=now_s,
            expiry_s=now_s + self.lease_s,
            fields=heartbeat_fields(request, now_s),
            swap=request.last_swap,
        )
        script_keys, args = script_arguments(self.keys, [entry])
        (outcome,) = parse_outcomes(self._heartbeat_script(keys=script_keys, args=args))
        if outcome.code == UNKNOWN:
            raise UnknownWorkerError(f"no worker {worker_id} is registered")
        if outcome.code == DEAD:
            raise WorkerDeadError(f"worker {worker_id} is dead (its lease expired); register again")
        if outcome.swap_is_news:  # T_bcast bookkeeping: services/coordinator/broadcast_times.py
            BroadcastTimes(self.redis, self.keys).complete_pending(self.list_live())
        if outcome.swap_ignored is not None:
            self.ignored_swaps.count(outcome.swap_ignored)
        return WorkerState(outcome.state), entry.expiry_s

    def deregister(self, worker_id: str) -> None:
        k = self.keys
        known = self._forget_script(
            keys=[k.worker(worker_id), k.worker_leases, k.worker_ids, k.worker_dead],
            args=[worker_id, k.credential_prefix],
        )
        if not int(known):
            raise UnknownWorkerError(f"no worker {worker_id} is registered")

    def set_states(
        self, changes: Mapping[str, tuple[WorkerState, tuple[WorkerState, ...]]]
    ) -> dict[str, WorkerState | None]:
        """Per worker id: (new state, states it may change from), applied atomically per worker (a worker
        the sweeper just marked dead stays dead). Returns each worker's state after (None: unknown)."""
        now_s = self.clock()
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id, (state, allowed_from) in changes.items():
                self._set_state_script(
                    keys=[self.keys.worker(worker_id)],
                    args=[state.value, now_s, *(s.value for s in allowed_from)],
                    client=pipe,
                )
            results = pipe.execute()
        return {
            worker_id: WorkerState(redis_text(r)) if r else None for worker_id, r in zip(changes, results, strict=True)
        }

    def drain(self, worker_id: str) -> WorkerInfo:
        """Mark an active or standby worker draining (idempotent). Raises UnknownWorkerError or WorkerDeadError."""
        self.expire_due()
        after = self.set_states({worker_id: (WorkerState.DRAINING, (WorkerState.ACTIVE, WorkerState.STANDBY))})[
            worker_id
        ]
        if after is None:
            raise UnknownWorkerError(f"no worker {worker_id} is registered")
        if after == WorkerState.DEAD:
            raise WorkerDeadError(f"worker {worker_id} is dead (its lease expired); there is nothing to drain")
        return self.get(worker_id)

    def expire_due(self) -> list[str]:
        """Mark every worker whose lease has run out as dead; returns their ids."""
        now_s = self.clock()
        due = [redis_text(worker_id) for worker_id in self.redis.zrangebyscore(self.keys.worker_leases, "-inf", now_s)]
        k = self.keys
        return [
            worker_id
            for worker_id in due
            if self._expire_script(
                keys=[k.worker(worker_id), k.worker_leases, k.worker_dead], args=[worker_id, now_s, k.credential_prefix]
            )
        ]

    # reading (each applies due expiries first, so a reader never sees an expired worker as active)
    def get(self, worker_id: str) -> WorkerInfo:
        self.expire_due()
        record = self._read_record(worker_id)
        if record is None:
            raise UnknownWorkerError(f"no worker {worker_id} is registered")
        return record.public()

    def list_workers(self) -> list[WorkerInfo]:
        """Every registered worker, dead ones included, oldest registration first. O(every worker that ever
        registered and is not pruned yet): for tools and tests; the coordinator's own readers use `list_live`
        and `list_dead`."""
        self.expire_due()
        return self._records([redis_text(worker_id) for worker_id in self.redis.smembers(self.keys.worker_ids)])

    def list_live(self) -> list[WorkerInfo]:
        """The workers whose lease runs (every state but dead), oldest registration first. One script call per
        LIST_CHUNK records, returning them as one JSON document validated in one pass: at 1000 workers ~10x
        cheaper than parsing 1000 HGETALL replies in redis-py (the control loop reads this every second)."""
        self.expire_due()
        return self._records([redis_text(worker_id) for worker_id in self.redis.zrange(self.keys.worker_leases, 0, -1)])

    def list_dead(self, limit: int, offset: int = 0) -> list[WorkerInfo]:
        """Dead workers, the most recently dead first, `limit` of them from `offset` (a page: O(limit))."""
        self.expire_due()
        if limit <= 0:
            return []
        ids = [redis_text(w) for w in self.redis.zrevrange(self.keys.worker_dead, offset, offset + limit - 1)]
        records = {record.worker_id: record for record in self._records(ids)}
        return [records[worker_id] for worker_id in ids if worker_id in records]

    def num_dead(self) -> int:
        return int(self.redis.zcard(self.keys.worker_dead))

    def dead_due(self, before_s: float, limit: int) -> list[str]:
        """Ids of (at most `limit`) workers whose lease ran out at or before `before_s`, the oldest first."""
        raw = self.redis.zrangebyscore(self.keys.worker_dead, "-inf", before_s, start=0, num=limit)
        return [redis_text(worker_id) for worker_id in raw]

    def live_of(self, credential_id: str) -> list[str]:
        """The live identities of a join credential ("": the shared token)."""
        return sorted(redis_text(w) for w in self.redis.smembers(self.keys.credential_live(credential_id)))

    def index_the_dead(self) -> int:
        """Put every dead record missing from `worker_dead` into it (records written before it existed: a run
        resumed by a newer coordinator), so pruning finds them; returns how many. Once per coordinator start."""
        live = {redis_text(w) for w in self.redis.zrange(self.keys.worker_leases, 0, -1)}
        indexed = {redis_text(w) for w in self.redis.zrange(self.keys.worker_dead, 0, -1)}
        missing = [
            worker_id
            for raw in self.redis.sscan_iter(self.keys.worker_ids, count=1000)
            if (worker_id := redis_text(raw)) not in live and worker_id not in indexed
        ]
        # only those marked dead: one that registered meanwhile is live, and one left behind by a lost lease is
        # marked dead by its next heartbeat (the heartbeat script), then indexed there
        dead = [record for record in self._records(missing) if record.state == WorkerState.DEAD]
        if dead:
            self.redis.zadd(self.keys.worker_dead, {record.worker_id: record.lease_expires_at_s for record in dead})
        return len(dead)

    def _records(self, worker_ids: list[str]) -> list[WorkerInfo]:
        records: list[WorkerInfo] = []
        for start in range(0, len(worker_ids), LIST_CHUNK):
            raw = self._list_script(keys=[], args=[self.keys.worker(""), *worker_ids[start : start + LIST_CHUNK]])
            records.extend(_parse_worker_list(raw if raw not in (b"{}", "{}") else b"[]"))  # cjson: [] is {}
        return sorted(records, key=lambda r: (r.registered_at_s, r.worker_id))

    def ensure_known(self, worker_id: str) -> None:
        if not self.redis.exists(self.keys.worker(worker_id)):
            raise UnknownWorkerError(f"no worker {worker_id} is registered")

    def token_sha256_of(self, worker_id: str) -> str | None:
        """The stored token digest of a worker, or None when there is no such worker."""
        digest = self.redis.hget(self.keys.worker(worker_id), "token_sha256")
        return None if digest is None else redis_text(digest)

    def operator_of(self, worker_id: str) -> str | None:
        """The join credential a worker registered with ("": the shared token, and records older than
        credentials), or None when there is no such worker."""
        if not self.redis.exists(self.keys.worker(worker_id)):
            return None
        operator_id = self.redis.hget(self.keys.worker(worker_id), "operator_id")
        return "" if operator_id is None else redis_text(operator_id)

    def _read_record(self, worker_id: str) -> WorkerRecord | None:
        raw = self.redis.hgetall(self.keys.worker(worker_id))
        return _record_from_redis(raw) if raw else None


# What a heartbeat claims but the record never takes from it: the groups and samples done are counted by the
# work API as they are accepted (services/coordinator/work_leases.py), never taken on a worker's word.
CLAIMED_ONLY_FIELDS = {"last_swap", "num_groups_done", "num_samples_done"}


def heartbeat_fields(request: HeartbeatRequest, now_s: float) -> dict[str, str]:
    """The record fields a heartbeat stores (its swap report is kept apart, for T_bcast; its counts of work
    done are not stored: CLAIMED_ONLY_FIELDS)."""
    return _to_redis_fields({**request.model_dump(exclude=CLAIMED_ONLY_FIELDS), "last_heartbeat_s": now_s})


def _flat(fields: Mapping[str, str]) -> list[EncodableT]:
    """(field, value) pairs as a script's flat ARGV tail."""
    return [item for pair in fields.items() for item in pair]


def _to_redis_fields(values: Mapping[str, object]) -> dict[str, str]:
    """Hash values are strings; pydantic's lax mode parses them back ("1" -> True, "0.5" -> 0.5). None is
    stored as no field."""
    fields: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            fields[name] = "1" if value else "0"
        elif isinstance(value, Enum):
            fields[name] = str(value.value)
        else:
            fields[name] = repr(value) if isinstance(value, float) else str(value)
    return fields


def _record_from_redis(raw: Mapping[bytes | str, bytes | str]) -> WorkerRecord:
    return WorkerRecord.model_validate(
        sanitize_worker_record({redis_text(name): redis_text(value) for name, value in raw.items()})
    )


def _parse_worker_list(raw: bytes | str) -> list[WorkerInfo]:
    """The list script's JSON, validated in one pass; only when a record holds a bad value (unparsable,
    non-finite, out of bounds: services/coordinator/measurements.py) record by record, its bad numbers
    replaced and counted, a record that still does not validate left out (and counted)."""
    try:
        records = _WORKER_LIST.validate_json(raw)
        if all(_numbers_in_bounds(record) for record in records):
            return records
    except ValidationError:
        pass
    parsed = json.loads(raw)
    out: list[WorkerInfo] = []
    for item in parsed if isinstance(parsed, list) else []:
        try:
            out.append(WorkerInfo.model_validate(sanitize_worker_record(item)))
        except ValidationError:
            BAD_MEASUREMENTS.count("worker.record", item.get("worker_id", "?"))
    return out


def _numbers_in_bounds(record: WorkerInfo) -> bool:
    for name, (low, high, _) in WORKER_NUMBER_FIELDS.items():
        if not low <= getattr(record, name) <= high:  # NaN fails every comparison
            return False
    return all(low <= getattr(record, name) <= high for name, (low, high, _) in WORKER_INT_FIELDS.items())
