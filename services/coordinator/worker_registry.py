"""Worker membership and leases, all in Redis so any coordinator process (or a restarted one) sees the same set.

Layout (names from `shared.keys.RunKeys`):
- `worker(id)`: hash with the worker's record (the fields of `WorkerRecord`, values as strings)
- `worker_ids`: set of every registered id, alive or dead
- `worker_leases`: sorted set id -> lease expiry (unix seconds); only live workers are in it

A worker is DEAD once `now >= lease expiry`. Expiry is applied lazily by every read and by the
coordinator's sweeper; both go through `expire_due`. The check-and-mark steps run as Lua scripts so a
heartbeat racing the sweeper either extends a live lease or finds the worker dead, never both.
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


class WorkerRecord(WorkerInfo):
    """What the hash holds: the public info plus the sha256 of the worker's token (never the token)."""

    token_sha256: str

    def public(self) -> WorkerInfo:
        return WorkerInfo.model_validate(self.model_dump(exclude={"token_sha256"}))


# KEYS: worker hash, leases. ARGV: worker id, now_s. Marks the worker dead if its lease is still due.
# Returns 1 when it did.
_EXPIRE_LUA = """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if (not expiry) or tonumber(expiry) > tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'state', 'dead') end
return 1
"""


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

# KEYS: worker hash, leases, worker ids. ARGV: worker id, the presented token's sha256, now_s, expiry_s,
# state, the new token's sha256, then (field, value) pairs of the registration. Revives a known worker
# whose stored token digest is the presented one, if it is dead, active or standby (any other state,
# e.g. one an operator or the trust score put it in, is not the worker's to leave by rejoining).
# Returns 1 revived, 0 unknown, -1 wrong token, -2 not revivable in its state.
_REVIVE_LUA = """
local digest = redis.call('HGET', KEYS[1], 'token_sha256')
if not digest then return 0 end
if digest ~= ARGV[2] then return -1 end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'dead' and state ~= 'active' and state ~= 'standby' then return -2 end
redis.call('HSET', KEYS[1], 'state', ARGV[5], 'state_since_s', ARGV[3], 'last_heartbeat_s', ARGV[3],
  'lease_expires_at_s', ARGV[4], 'token_sha256', ARGV[6])
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"""
REVIVED, REVIVE_UNKNOWN, REVIVE_WRONG_TOKEN, REVIVE_REFUSED = 1, 0, -1, -2
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
    ) -> WorkerInfo:
        """A new worker's record and lease. `operator_id`: the join credential it registered with ("": the
        shared token; services/coordinator/operators.py), fixed for the record's life."""
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
        with self.redis.pipeline(transaction=True) as pipe:
            fields: dict[EncodableT, EncodableT] = dict(_to_redis_fields(record.model_dump()).items())
            pipe.hset(self.keys.worker(worker_id), mapping=fields)
            pipe.sadd(self.keys.worker_ids, worker_id)
            pipe.zadd(self.keys.worker_leases, {worker_id: record.lease_expires_at_s})
            pipe.execute()
        return record.public()

    def revive(
        self,
        worker_id: str,
        request: RegisterWorkerRequest,
        presented_token_sha256: str,
        new_token_sha256: str,
        state: WorkerState = WorkerState.ACTIVE,
    ) -> int:
        """A returning worker (its lease ran out, or the coordinator lost it for a while) takes its own
        record back: same id, same totals and registration time; a fresh lease, `state`, the new token's
        digest and the registration's fields. Checked and applied in one script, so the presented token
        is the one stored at that moment. Returns REVIVED, REVIVE_UNKNOWN (no such record: pruned or
        never known), REVIVE_WRONG_TOKEN or REVIVE_REFUSED (its state is not dead, active or standby)."""
        now_s = self.clock()
        fields = _to_redis_fields(request.model_dump(exclude={"previous_worker_id"}))
        args: list[EncodableT] = [worker_id, presented_token_sha256, repr(now_s), repr(now_s + self.lease_s)]
        args += [state.value, new_token_sha256, *(item for pair in fields.items() for item in pair)]
        outcome = self._revive_script(
            keys=[self.keys.worker(worker_id), self.keys.worker_leases, self.keys.worker_ids], args=args
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
            BroadcastTimes(self.redis, self.keys).complete_pending(self.list_workers())
        if outcome.swap_ignored is not None:
            self.ignored_swaps.count(outcome.swap_ignored)
        return WorkerState(outcome.state), entry.expiry_s

    def deregister(self, worker_id: str) -> None:
        self.ensure_known(worker_id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(worker_id))
            pipe.srem(self.keys.worker_ids, worker_id)
            pipe.zrem(self.keys.worker_leases, worker_id)
            pipe.execute()

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
        return [
            worker_id
            for worker_id in due
            if self._expire_script(keys=[self.keys.worker(worker_id), self.keys.worker_leases], args=[worker_id, now_s])
        ]

    # reading (each applies due expiries first, so a reader never sees an expired worker as active)
    def get(self, worker_id: str) -> WorkerInfo:
        self.expire_due()
        record = self._read_record(worker_id)
        if record is None:
            raise UnknownWorkerError(f"no worker {worker_id} is registered")
        return record.public()

    def list_workers(self) -> list[WorkerInfo]:
        """Every registered worker, dead ones included, oldest registration first. One script call that
        returns every record as one JSON document, validated in one pass: at 1000 workers ~10x cheaper
        than parsing 1000 HGETALL replies in redis-py (the control loop reads this every second)."""
        self.expire_due()
        worker_ids = [redis_text(worker_id) for worker_id in self.redis.smembers(self.keys.worker_ids)]
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


def _to_redis_fields(values: Mapping[str, object]) -> dict[str, str]:
    """Hash values are strings; pydantic's lax mode parses them back ("1" -> True, "0.5" -> 0.5)."""
    fields: dict[str, str] = {}
    for name, value in values.items():
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
