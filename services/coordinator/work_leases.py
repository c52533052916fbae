"""Tasks leased to workers, and their answers, on the workers' behalf: the only path from a worker to the
shared streams (the contract: shared/work_api.py; the counters: shared/work_counts.py).

A lease is a pending entry of `tasks` in the `rollout` group, its consumer named after the worker id, so
Redis itself records who holds what and for how long (XPENDING). Each operation is one Lua script, so the
check and its effects are one atomic step that no concurrent call can split:

    lease    the caller is active (its record and its live lease); entries idle past the lease time are
             taken over (XCLAIM), counted `expired` for their holder and `leased` for the caller; then new
             entries (XREADGROUP). A task leased MAX_LEASES_PER_TASK times and never answered is
             dead-lettered instead of handed out again (it keeps killing its workers). The caller holds at
             most `max_held` leases ([work] max_held_tasks), those past their lease time included: past it,
             it gets fewer tasks or none (an empty answer, as when no task is queued: a worker backs off). A
             lease it let expire comes back to it only after a second lease time, so a worker that never
             answers cannot keep renewing its own leases (an honest one alone in a fleet still gets them).
    answer   the caller holds the lease now -> the group goes to `rollouts` (an id Redis chooses, no MAXLEN) and
             the task is acked, counted `returned` and `accepted`; otherwise, or when the group is
             malformed or answers another task or claims another worker, it is dead-lettered and counted
             `refused`, the lease left as it was (an answer after the lease was reissued, or a second
             answer, finds it not held).
    fail     the caller holds the lease -> the task is dead-lettered with the worker's error and acked,
             counted `failed`.

Checks that need no Redis (decoding, task id, worker id, run id) are made first, in Python: a stream
entry never changes, so reading the task before the script cannot race with anything; only who holds
the lease can, and the script checks that. Dead letters carry the refused group (or the task) cut to
MAX_DEAD_LETTER_PAYLOAD_BYTES, under source stream `tasks`. The accounting (cluster/accounting.py) counts
from these counters, not from stream lengths (the reward service trims `rollouts` once consumed): groups
produced are `accepted`, and tasks dead-lettered here are the acks of `tasks` that produced no group.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any, cast

import redis
from redis.typing import EncodableT

from services.coordinator.work_accounting import WorkBooks
from shared.bus import PAYLOAD_FIELD, redis_text
from shared.config import WorkConfig
from shared.keys import RunKeys
from shared.messages import DeadLetter, MessageDecodeError, RolloutGroup, TaskGroup
from shared.streams import DEAD, ROLLOUTS, TASKS
from shared.work_api import LeasedTask, Refusal, SubmitResponse, SubmittedGroup, WorkAccounting
from shared.work_counts import WorkCounter

log = logging.getLogger(__name__)

MAX_LEASES_PER_TASK = 3  # as the bus's max_deliveries: a task that expired this often is dead-lettered
MAX_DEAD_LETTER_PAYLOAD_BYTES = 64 * 1024
PENDING_SCAN_FACTOR = 10  # expired leases are looked for among the oldest max_groups * this pending entries
SERVICE = "coordinator-work-api"
# How long an accepted answer is remembered, so that the same bytes sent again (a retry after a lost reply)
# are accepted once more instead of dead-lettered: longer than any client's retry window.
ANSWERED_TTL_S = 600
NOT_HELD = "the lease is not held by this worker (never leased to it, reissued after its lease time, or answered)"

# KEYS: tasks, worker hash, worker leases (zset), caller's counts, totals, worker ids (set)
# ARGV: group, caller id, now_s, lease ms, max tasks, pending scan limit, counts key prefix, max leases per task,
# max leases held by one worker
# Returns {state} when the caller may not lease ('unknown', 'dead', or its state), else
# {'active', entries, retire} with entries [[id, [field, value, ...]], ...] leased to the caller and retire
# [[id, holder], ...]: expired entries leased too often, for the caller to dead-letter (_RETIRE_LUA).
# `room`: how many more leases the caller may hold; taking back its own expired lease does not change it.
_LEASE_LUA = """
local state = redis.call('HGET', KEYS[2], 'state')
if not state then return {'unknown'} end
local expiry = redis.call('ZSCORE', KEYS[3], ARGV[2])
if (not expiry) or tonumber(expiry) <= tonumber(ARGV[3]) then return {'dead'} end
if state ~= 'active' then return {state} end
local lease_ms, count, max_leases, max_held = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[8]), tonumber(ARGV[9])
local room = max_held - #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', max_held, ARGV[2])
local entries, retire = {}, {}
for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', ARGV[6])) do
  if #entries >= count then break end
  local own = p[2] == ARGV[2]
  local min_idle = own and 2 * lease_ms or lease_ms
  if p[3] >= min_idle then
    if p[4] >= max_leases then
      retire[#retire + 1] = {p[1], p[2]}
    elseif own or room > 0 then
      local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], min_idle, p[1])
      redis.call('HINCRBY', ARGV[7] .. p[2], 'expired', 1)
      redis.call('HINCRBY', KEYS[5], 'expired', 1)
      if claimed[1] then
        entries[#entries + 1] = claimed[1]
        if not own then room = room - 1 end
      end
    end
  end
end
local fresh = math.min(count - #entries, room)
if fresh > 0 then
  local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', fresh, 'STREAMS', KEYS[1], '>')
  if read then
    for _, entry in ipairs(read[1][2]) do entries[#entries + 1] = entry end
  end
end
if #entries > 0 then
  redis.call('HINCRBY', KEYS[4], 'leased', #entries)
  redis.call('HINCRBY', KEYS[5], 'leased', #entries)
  redis.call('SADD', KEYS[6], ARGV[2])
end
return {'active', entries, retire}
"""

# KEYS: tasks, rollouts, dead, caller's counts, totals, worker ids (set), caller's worker record, the lease's
# answered marker. ARGV: group, caller id, lease id, refusal ('1': refuse, '' accept), payload (the group, or the
# dead letter of a refusal), the dead letter to write when the lease is not held, the group's number of
# samples, "<caller id>:<sha256 of the answer>", the marker's TTL (s).
# An accepted group also counts on the caller's record (num_groups_done, num_samples_done: what /v1/workers
# and the dashboard show), only if the record still exists.
# Returns {1, rollouts entry id} accepted, {1, 'repeat'} the caller's accepted answer sent again (nothing
# written), {0, 'held'} refused for its content, {0, 'not-held'}.
_ANSWER_LUA = """
redis.call('SADD', KEYS[6], ARGV[2])
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #pending == 0 or pending[1][2] ~= ARGV[2] then
  if redis.call('GET', KEYS[8]) == ARGV[8] then return {1, 'repeat'} end
  redis.call('XADD', KEYS[3], '*', 'data', ARGV[6])
  redis.call('HINCRBY', KEYS[4], 'refused', 1)
  redis.call('HINCRBY', KEYS[5], 'refused', 1)
  return {0, 'not-held'}
end
redis.call('HINCRBY', KEYS[4], 'returned', 1)
redis.call('HINCRBY', KEYS[5], 'returned', 1)
if ARGV[4] ~= '' then
  redis.call('XADD', KEYS[3], '*', 'data', ARGV[5])
  redis.call('HINCRBY', KEYS[4], 'refused', 1)
  redis.call('HINCRBY', KEYS[5], 'refused', 1)
  return {0, 'held'}
end
local id = redis.call('XADD', KEYS[2], '*', 'data', ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('SET', KEYS[8], ARGV[8], 'EX', ARGV[9])
redis.call('HINCRBY', KEYS[4], 'accepted', 1)
redis.call('HINCRBY', KEYS[5], 'accepted', 1)
if redis.call('EXISTS', KEYS[7]) == 1 then
  redis.call('HINCRBY', KEYS[7], 'num_groups_done', 1)
  redis.call('HINCRBY', KEYS[7], 'num_samples_done', ARGV[7])
end
return {1, id}
"""

# KEYS: tasks, dead, totals, worker ids (set). ARGV: group, entry id, holder, min idle ms, dead letter, counts key prefix,
# counter field, delta. Dead-letters and acks the entry if `holder` still holds it, idle that long; counts
# `delta` on the holder's and the total `field`. Returns 1 if it did.
_RETIRE_LUA = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[4], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= ARGV[3] then return 0 end
redis.call('XADD', KEYS[2], '*', 'data', ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', ARGV[6] .. ARGV[3], ARGV[7], ARGV[8])
redis.call('HINCRBY', KEYS[3], ARGV[7], ARGV[8])
redis.call('SADD', KEYS[4], ARGV[3])
return 1
"""


class LeaseRefusedError(Exception):
    """The caller may not lease now; `state` says why ('unknown', 'dead', or a state other than active)."""

    def __init__(self, state: str) -> None:
        super().__init__(f"worker state {state}")
        self.state = state


class WorkLeases:
    """The work API's stream operations for one run. `lease_ms`: how long a worker has to answer a task;
    `config`: what one worker may hold, and the reward flag's thresholds."""

    def __init__(self, client: redis.Redis, keys: RunKeys, *, lease_ms: int, config: WorkConfig | None = None) -> None:
        self.redis = client
        self.keys = keys
        self.lease_ms = lease_ms
        self.config = config or WorkConfig()
        self.books = WorkBooks(client, keys, self.config, lease_s=lease_ms / 1000)
        self.group = cast(str, TASKS.group)
        self.tasks, self.rollouts, self.dead = (keys.name_of(s) for s in (TASKS, ROLLOUTS, DEAD))
        self._lease_script = client.register_script(_LEASE_LUA)
        self._answer_script = client.register_script(_ANSWER_LUA)
        self._retire_script = client.register_script(_RETIRE_LUA)

    @property
    def lease_s(self) -> float:
        return self.lease_ms / 1000

    # leasing
    def lease(self, worker_id: str, max_groups: int, now_s: float) -> list[LeasedTask]:
        """Up to `max_groups` tasks for `worker_id`: expired leases first, then new tasks, as long as it holds
        at most `max_held_tasks` leases (fewer or none past it). Raises LeaseRefusedError when the worker is
        not active (or unknown, or dead at `now_s`)."""
        reply = self._run_lease_script(worker_id, max_groups, now_s)
        state = redis_text(reply[0])
        if state != "active":
            raise LeaseRefusedError(state)
        entries, retire = reply[1], reply[2]
        for entry_id, holder in retire:
            self._retire_overleased(redis_text(entry_id), redis_text(holder))
        leased: list[LeasedTask] = []
        for raw_id, fields in entries:
            entry_id, payload = redis_text(raw_id), _payload_of(fields)
            try:
                leased.append(LeasedTask(lease_id=entry_id, task=TaskGroup.decode(payload)))
            except MessageDecodeError as exc:  # the reward service wrote it; it never reaches a worker
                letter = self._letter(entry_id, payload, f"undecodable task: {exc}", num_deliveries=1)
                self._retire(entry_id, worker_id, 0, letter, WorkCounter.LEASED, -1)  # the lease never reached it
        return leased

    def _run_lease_script(self, worker_id: str, max_groups: int, now_s: float) -> Any:
        keys = [
            self.tasks,
            self.keys.worker(worker_id),
            self.keys.worker_leases,
            self.keys.work_counts(worker_id),
            self.keys.work_totals,
            self.keys.work_worker_ids,
        ]
        args: list[EncodableT] = [
            self.group,
            worker_id,
            repr(now_s),
            self.lease_ms,
            max_groups,
            max_groups * PENDING_SCAN_FACTOR,
            self.keys.work_counts(""),
            MAX_LEASES_PER_TASK,
            self.config.max_held_tasks,
        ]
        try:
            return self._lease_script(keys=keys, args=args)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        self.ensure_group()  # the first lease of a run: the reward service may not have created it yet
        return self._lease_script(keys=keys, args=args)

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.tasks, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _retire_overleased(self, entry_id: str, holder: str) -> None:
        entries = self.redis.xrange(self.tasks, min=entry_id, max=entry_id, count=1)
        payload = _payload_of(entries[0][1]) if entries else b""
        reason = f"leased {MAX_LEASES_PER_TASK} times and never answered (last holder {holder})"
        letter = self._letter(entry_id, payload, reason, num_deliveries=MAX_LEASES_PER_TASK)
        if self._retire(entry_id, holder, self.lease_ms, letter, WorkCounter.EXPIRED, 1):
            log.warning("dead-lettered task %s: %s", entry_id, reason)

    def _retire(
        self, entry_id: str, holder: str, min_idle_ms: int, letter: bytes, counter: WorkCounter, delta: int
    ) -> bool:
        keys = [self.tasks, self.dead, self.keys.work_totals, self.keys.work_worker_ids]
        args: list[EncodableT] = [self.group, entry_id, holder, min_idle_ms, letter, self.keys.work_counts("")]
        args += [counter.value, delta]
        return bool(self._retire_script(keys=keys, args=args))

    # answering
    def submit(self, worker_id: str, groups: Sequence[SubmittedGroup]) -> SubmitResponse:
        """Each group in turn: checked, then accepted or refused in one script call (see the module doc)."""
        tasks = self._read_tasks([group.lease_id for group in groups])
        accepted: list[str] = []
        refused: list[Refusal] = []
        for submitted in groups:
            checked = self._check(worker_id, submitted, tasks.get(submitted.lease_id))
            if isinstance(checked, RolloutGroup):
                payload, refuse = checked.encode(), ""  # re-encoded: only what validated goes on
            else:
                payload, refuse = self._refusal_letter(worker_id, submitted, checked), "1"
            keys = [self.tasks, self.rollouts, self.dead, self.keys.work_counts(worker_id), self.keys.work_totals]
            keys += [
                self.keys.work_worker_ids,
                self.keys.worker(worker_id),
                self.keys.work_answered(submitted.lease_id),
            ]
            args: list[EncodableT] = [self.group, worker_id, submitted.lease_id, refuse, payload]
            args.append(self._refusal_letter(worker_id, submitted))  # written instead if the lease is not held
            args.append(checked.num_samples if isinstance(checked, RolloutGroup) else 0)
            args += [f"{worker_id}:{hashlib.sha256(submitted.group).hexdigest()}", ANSWERED_TTL_S]
            done, outcome = self._answer_script(keys=keys, args=args)
            if int(done):
                if redis_text(outcome) == "repeat":
                    log.info(
                        "%s sent its accepted answer to lease %s again: accepted once", worker_id, submitted.lease_id
                    )
                accepted.append(submitted.lease_id)
                continue
            reason = NOT_HELD if redis_text(outcome) == "not-held" else cast(str, checked)
            refused.append(Refusal(lease_id=submitted.lease_id, reason=reason))
            log.info("refused an answer of %s to lease %s: %s", worker_id, submitted.lease_id, reason)
        return SubmitResponse(accepted=accepted, refused=refused)

    def _check(self, worker_id: str, submitted: SubmittedGroup, task: TaskGroup | str | None) -> RolloutGroup | str:
        """The group, if its content may answer the lease; else why not."""
        try:
            group = RolloutGroup.decode(submitted.group)
        except MessageDecodeError as exc:
            return f"malformed group: {str(exc)[:500]}"
        if isinstance(task, str):
            return task
        if task is None:
            return f"no task {submitted.lease_id} on the tasks stream"
        if group.run_id != self.keys.run_id:
            return f"group of run {group.run_id[:128]!r}, not {self.keys.run_id!r}"
        if group.worker_id != worker_id:
            return f"group claims worker {group.worker_id!r}, not the caller"
        if group.task_id != task.task_id or group.task_name != task.task_name:
            return f"group answers task {group.task_id!r}, the lease is task {task.task_id!r}"
        return group

    def _refusal_letter(self, worker_id: str, submitted: SubmittedGroup, reason: str = NOT_HELD) -> bytes:
        return self._letter(submitted.lease_id, submitted.group, f"answer of worker {worker_id} refused: {reason}")

    def _read_tasks(self, entry_ids: Sequence[str]) -> dict[str, TaskGroup | str]:
        """The tasks behind these lease ids (entry id -> task, or why it cannot be read); absent: no entry."""
        with self.redis.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.xrange(self.tasks, min=entry_id, max=entry_id, count=1)
            replies = pipe.execute()
        tasks: dict[str, TaskGroup | str] = {}
        for entry_id, entries in zip(entry_ids, replies, strict=True):
            if entries:
                try:
                    tasks[entry_id] = TaskGroup.decode(_payload_of(entries[0][1]))
                except MessageDecodeError as exc:
                    tasks[entry_id] = f"the leased task is undecodable: {exc}"
        return tasks

    # failing
    def fail(self, worker_id: str, lease_id: str, error: str) -> bool:
        """Dead-letter and ack a task the worker cannot serve; False when it does not hold the lease."""
        entries = self.redis.xrange(self.tasks, min=lease_id, max=lease_id, count=1)
        payload = _payload_of(entries[0][1]) if entries else b""
        letter = self._letter(lease_id, payload, f"worker {worker_id} could not serve it: {error}")
        return self._retire(lease_id, worker_id, 0, letter, WorkCounter.FAILED, 1)

    # accounting (services/coordinator/work_accounting.py)
    def accounting(self) -> WorkAccounting:
        return self.books.accounting()

    def _letter(self, entry_id: str, payload: bytes, error: str, num_deliveries: int = 0) -> bytes:
        return DeadLetter(
            run_id=self.keys.run_id,
            source_stream=self.tasks,
            source_message_id=entry_id,
            consumer_group=self.group,
            service=SERVICE,
            error=error[:4000],
            payload=payload[:MAX_DEAD_LETTER_PAYLOAD_BYTES],
            num_deliveries=num_deliveries,
        ).encode()


def _payload_of(fields: Any) -> bytes:
    """The payload of an entry's fields as a script or redis-py returns them: a flat list or a dict."""
    if isinstance(fields, dict):
        return cast(bytes, fields.get(PAYLOAD_FIELD, b""))
    pairs = dict(zip(fields[::2], fields[1::2], strict=True))
    return cast(bytes, pairs.get(PAYLOAD_FIELD, b""))
