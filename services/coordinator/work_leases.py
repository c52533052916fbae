"""Tasks leased to workers, and their answers, on the workers' behalf: the only path from a worker to the
shared streams (the contract: shared/work_api.py; the counters: shared/work_counts.py; the scripts and the
rules of what a worker and its credential may hold: services/coordinator/work_scripts.py).

A lease is a pending entry of `tasks` in the `rollout` group, its consumer named after the worker id, so
Redis itself records who holds what and for how long (XPENDING). Each operation is one Lua script, so the
check and its effects are one atomic step that no concurrent call can split:

    lease    the caller is active (its record and its live lease) and its credential is not quarantined;
             entries idle past the lease time are taken over (XCLAIM), counted `expired` for their holder
             (whose allowance halves) and `leased` for the caller; then new entries (XREADGROUP). The caller
             and its credential hold at most what they have earned (an empty answer past it, as when no task
             is queued: a worker backs off). A task MAX_LEASES_PER_TASK proven holders let expire is
             dead-lettered instead of handed out again (it keeps killing its workers).
    answer   the caller holds the lease now -> the group goes to `rollouts` (an id Redis chooses, no MAXLEN) and
             the task is acked, counted `returned` and `accepted`; otherwise, or when the group is
             malformed or answers another task or claims another worker, it is refused: counted `refused`,
             the lease left as it was (an answer after the lease was reissued, or a second answer, finds it
             not held), and its dead letter (MAX_REFUSAL_PAYLOAD_BYTES of what was sent) kept in the
             caller's credential's own stream of REFUSALS_KEPT.
    fail     the caller holds the lease -> a task it took while still earning its allowance is given back
             (another worker takes it); any other is dead-lettered with the worker's error and acked, counted
             `failed`. Either way the caller's allowance halves.

Eval tasks (held-out evaluation by the workers) are leased, answered and given back through the same calls, by
services/coordinator/eval_leases.py, on their own streams and counters: nothing below applies to them.

Checks that need no Redis (decoding, task id, worker id, run id) are made first, in Python: a stream
entry never changes, so reading the task before the script cannot race with anything; only who holds
the lease can, and the script checks that. A task's dead letter carries the task cut to
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

from services.coordinator import work_scripts
from services.coordinator.answer_check import check_answer
from services.coordinator.eval_leases import EvalLeases
from services.coordinator.lease_pacing import Full
from services.coordinator.work_accounting import WorkBooks
from services.coordinator.work_scripts import INITIAL_ALLOWANCE, MAX_LEASES_PER_TASK
from shared.bus import PAYLOAD_FIELD, redis_text
from shared.config import CredentialConfig, WorkConfig
from shared.keys import RunKeys
from shared.messages import DeadLetter, MessageDecodeError, RolloutGroup, TaskGroup
from shared.streams import DEAD, ROLLOUTS, TASKS
from shared.work_api import LeasedTask, Refusal, SubmitResponse, SubmittedGroup, WorkAccounting
from shared.work_counts import WorkCounter

log = logging.getLogger(__name__)

MAX_DEAD_LETTER_PAYLOAD_BYTES = 64 * 1024  # a task's dead letter (the task itself: the reward service wrote it)
# A refused answer's dead letter keeps this much of what the worker sent (a sha256 of it all is in the error), in
# its credential's own stream of at most REFUSALS_KEPT: what a worker's refusals leave behind is bounded per
# credential (~100 KiB), and never pushes another's dead letters out of `dead`.
MAX_REFUSAL_PAYLOAD_BYTES = 512
REFUSALS_KEPT = 200
PENDING_SCAN_FACTOR = 10  # expired leases are looked for among the oldest max_groups * this pending entries
SERVICE = "coordinator-work-api"
# How long an accepted answer is remembered, so that the same bytes sent again (a retry after a lost reply)
# are accepted once more instead of dead-lettered: longer than any client's retry window.
ANSWERED_TTL_S = 600
NOT_HELD = "the lease is not held by this worker (never leased to it, reissued after its lease time, or answered)"
GIVEN_BACK, RETIRED = "given back", "retired"


class LeaseRefusedError(Exception):
    """The caller may not lease now; `state` says why ('unknown', 'dead', or a state other than active)."""

    def __init__(self, state: str) -> None:
        super().__init__(f"worker state {state}")
        self.state = state


class WorkLeases:
    """The work API's stream operations for one run. `lease_ms`: how long a worker has to answer a task;
    `config`: what one worker may hold, and the reward flag's thresholds; `credentials`: what one join
    credential may hold by default (an admin's per-credential budget wins: services/coordinator/credential_budget.py)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RunKeys,
        *,
        lease_ms: int,
        config: WorkConfig | None = None,
        credentials: CredentialConfig | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.lease_ms = lease_ms
        self.config = config or WorkConfig()
        self.credentials = credentials or CredentialConfig()
        self.books = WorkBooks(client, keys, self.config, lease_s=lease_ms / 1000)
        self.group = cast(str, TASKS.group)
        self.tasks, self.rollouts, self.dead = (keys.name_of(s) for s in (TASKS, ROLLOUTS, DEAD))
        self._lease_script = client.register_script(work_scripts.LEASE)
        self._answer_script = client.register_script(work_scripts.ANSWER)
        self._retire_script = client.register_script(work_scripts.RETIRE)
        self._give_back_script = client.register_script(work_scripts.GIVE_BACK)
        self._reconcile_script = client.register_script(work_scripts.RECONCILE)
        self._fold_script = client.register_script(work_scripts.FOLD)
        self.evals = EvalLeases(client, keys, lease_ms=lease_ms)  # held-out evaluation's tasks

    @property
    def lease_s(self) -> float:
        return self.lease_ms / 1000

    # leasing
    def lease(self, worker_id: str, max_groups: int, now_s: float) -> list[LeasedTask]:
        """Up to `max_groups` tasks for `worker_id`: expired leases first, then new tasks, as long as it and its
        credential hold no more than they have earned (services/coordinator/work_scripts.py; fewer or none past
        it). Raises LeaseRefusedError when the worker is not active (or unknown, or dead at `now_s`, or its
        credential is quarantined)."""
        return self.lease_or_full(worker_id, max_groups, now_s)[0]

    def lease_or_full(self, worker_id: str, max_groups: int, now_s: float) -> tuple[list[LeasedTask], Full]:
        """As lease(), with why it got nothing when it got nothing: it, or its credential, holds all it may
        (Full.OWN, Full.CREDENTIAL), or there was nothing to lease (Full.NOT)."""
        reply = self._run_lease_script(worker_id, max_groups, now_s)
        state = redis_text(reply[0])
        if state != "active":
            raise LeaseRefusedError(state)
        entries, retire, full = reply[1], reply[2], Full(redis_text(reply[3]))
        for entry_id, holder in retire:
            self._retire_overleased(redis_text(entry_id), redis_text(holder), now_s)
        leased: list[LeasedTask] = []
        for raw_id, fields in entries:
            entry_id, payload = redis_text(raw_id), _payload_of(fields)
            try:
                leased.append(LeasedTask(lease_id=entry_id, task=TaskGroup.decode(payload)))
            except MessageDecodeError as exc:  # the reward service wrote it; it never reaches a worker
                letter = self._letter(entry_id, payload, f"undecodable task: {exc}", num_deliveries=1)
                self._retire(entry_id, worker_id, 0, letter, WorkCounter.LEASED, -1, now_s)  # it never reached it
        return leased, full

    def lease_evals(self, worker_id: str, policy_version: int, max_groups: int, now_s: float) -> list[LeasedTask]:
        """Up to `max_groups` eval tasks of exactly `policy_version` (services/coordinator/eval_leases.py). Raises
        LeaseRefusedError as lease() does."""
        reply = self.evals.lease(worker_id, policy_version, max_groups, now_s)
        if reply.state != "active":
            raise LeaseRefusedError(reply.state)
        return reply.tasks

    def _run_lease_script(self, worker_id: str, max_groups: int, now_s: float) -> Any:
        k = self.keys
        keys = [
            self.tasks,
            k.worker(worker_id),
            k.worker_leases,
            k.work_counts(worker_id),
            k.work_totals,
            k.work_worker_ids,
            k.work_speculative,
        ]
        args: list[EncodableT] = [
            self.group,
            worker_id,
            repr(now_s),
            self.lease_ms,
            max_groups,
            max_groups * PENDING_SCAN_FACTOR,
            k.work_counts(""),
            MAX_LEASES_PER_TASK,
            self.config.max_held_tasks,
            k.credential_prefix,
            k.operator(""),
            k.operator_quarantine(""),
            k.worker_rewards(""),
            INITIAL_ALLOWANCE,
            self.credentials.max_leases,
            "1" if self.config.earn_leases else "",
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

    def _retire_overleased(self, entry_id: str, holder: str, now_s: float) -> None:
        entries = self.redis.xrange(self.tasks, min=entry_id, max=entry_id, count=1)
        payload = _payload_of(entries[0][1]) if entries else b""
        reason = f"{MAX_LEASES_PER_TASK} proven holders let it expire (the last: {holder})"
        letter = self._letter(entry_id, payload, reason, num_deliveries=MAX_LEASES_PER_TASK)
        if self._retire(entry_id, holder, self.lease_ms, letter, WorkCounter.EXPIRED, 1, now_s, cut=True):
            log.warning("dead-lettered task %s: %s", entry_id, reason)

    def _retire(
        self,
        entry_id: str,
        holder: str,
        min_idle_ms: int,
        letter: bytes,
        counter: WorkCounter,
        delta: int,
        now_s: float,
        *,
        cut: bool = False,
    ) -> bool:
        """Dead-letter and ack a lease `holder` holds (idle at least `min_idle_ms`), counting `delta` on `counter`;
        `cut`: the lease ended unanswered, the holder's allowance halves. False when it does not hold it."""
        k = self.keys
        keys = [self.tasks, self.dead, k.work_totals, k.work_worker_ids, k.work_speculative]
        args: list[EncodableT] = [self.group, entry_id, holder, min_idle_ms, letter, k.work_counts("")]
        cut = cut and self.config.earn_leases
        args += [counter.value, delta, k.credential_prefix, "1" if cut else "", repr(now_s), self.lease_s]
        args.append(INITIAL_ALLOWANCE)
        return bool(self._retire_script(keys=keys, args=args))

    # the control loop's upkeep
    def reconcile(self, credential_ids: Sequence[str]) -> int:
        """Recount each credential's held leases and the speculative set from XPENDING (work_scripts.RECONCILE);
        `credential_ids`: those whose count may be stale (set to 0 unless they hold leases). Returns the leases
        held in all."""
        args: list[EncodableT] = [self.group, self.keys.credential_prefix, self.keys.work_counts(""), *credential_ids]
        try:
            return int(self._reconcile_script(keys=[self.tasks, self.keys.work_speculative], args=args))
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                raise
            return 0  # no stream or group yet: nothing held

    def fold(self, worker_ids: Sequence[str]) -> None:
        """Bring what the reward service judged of these identities into their allowance and their credential's
        record (the lease script does it for a caller; this for identities that may not lease again soon)."""
        if not worker_ids:
            return
        k = self.keys
        args: list[EncodableT] = [k.work_counts(""), k.credential_prefix, k.worker_rewards(""), INITIAL_ALLOWANCE]
        args += [self.config.max_held_tasks, self.credentials.max_leases, k.operator("")]
        args += ["1" if self.config.earn_leases else "", *worker_ids]
        self._fold_script(keys=[], args=args)

    # answering
    def submit(self, worker_id: str, groups: Sequence[SubmittedGroup]) -> SubmitResponse:
        """Each group in turn: checked, then accepted or refused in one script call (see the module doc); eval
        answers by services/coordinator/eval_leases.py."""
        accepted, refused = self.evals.submit(worker_id, [group for group in groups if group.eval_version is not None])
        groups = [group for group in groups if group.eval_version is None]
        tasks = self._read_tasks([group.lease_id for group in groups])
        for submitted in groups:
            checked = self._check(worker_id, submitted, tasks.get(submitted.lease_id))
            if isinstance(checked, RolloutGroup):
                payload, refuse = checked.encode(), ""  # re-encoded: only what validated goes on
            else:
                payload, refuse = self._refusal_letter(worker_id, submitted, checked), "1"
            k = self.keys
            keys = [self.tasks, self.rollouts, k.work_counts(worker_id), k.work_totals, k.work_worker_ids]
            keys += [k.worker(worker_id), k.work_answered(submitted.lease_id), k.work_speculative]
            args: list[EncodableT] = [self.group, worker_id, submitted.lease_id, refuse, payload]
            args.append(self._refusal_letter(worker_id, submitted))  # written instead if the lease is not held
            args.append(checked.num_samples if isinstance(checked, RolloutGroup) else 0)
            args += [f"{worker_id}:{hashlib.sha256(submitted.group).hexdigest()}", ANSWERED_TTL_S]
            args += [k.work_counts(""), k.credential_prefix, REFUSALS_KEPT]
            done, outcome = self._answer(keys, args)
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

    def _answer(self, keys: list[str], args: list[EncodableT]) -> Any:
        """The answer script; before any lease of the run (no consumer group yet) it creates the group first: an
        answer then finds its lease not held and is refused, never a 500."""
        try:
            return self._answer_script(keys=keys, args=args)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        self.ensure_group()
        return self._answer_script(keys=keys, args=args)

    def _check(self, worker_id: str, submitted: SubmittedGroup, task: TaskGroup | str | None) -> RolloutGroup | str:
        """The group, if its content may answer the lease; else why not."""
        return check_answer(
            self.keys.run_id, worker_id, submitted, task, f"no task {submitted.lease_id} on the tasks stream"
        )

    def _refusal_letter(self, worker_id: str, submitted: SubmittedGroup, reason: str = NOT_HELD) -> bytes:
        """What a refused answer leaves behind: the reason, the sha256 and size of what was sent, and its first
        MAX_REFUSAL_PAYLOAD_BYTES (see REFUSALS_KEPT)."""
        sent = submitted.group
        error = (
            f"answer of worker {worker_id} refused: {reason} "
            f"({len(sent)} bytes, sha256 {hashlib.sha256(sent).hexdigest()})"
        )
        return self._letter(submitted.lease_id, sent[:MAX_REFUSAL_PAYLOAD_BYTES], error)

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
    def fail(
        self, worker_id: str, lease_id: str, error: str, now_s: float, eval_version: int | None = None
    ) -> str | None:
        """A task the worker cannot serve: given back (GIVEN_BACK) when the worker took it while still earning its
        allowance (it goes to a proven worker, counted `expired` for this one), else dead-lettered and acked,
        counted `failed` (RETIRED); either way the worker's allowance halves. None: it does not hold the lease.
        An eval lease (`eval_version`) is always given back, without penalty (eval_leases.py)."""
        if eval_version is not None:
            if not self.evals.give_back(worker_id, eval_version, lease_id):
                return None
            log.info("%s gave back eval task %s of version %d (%s)", worker_id, lease_id, eval_version, error[:200])
            return GIVEN_BACK
        given_back = self._give_back_script(
            keys=[self.tasks, self.keys.work_speculative],
            args=[self.group, lease_id, worker_id, self.lease_ms, MAX_LEASES_PER_TASK],
        )
        if int(given_back):
            log.info("%s gave back task %s (%s): it goes to another worker", worker_id, lease_id, error[:200])
            return GIVEN_BACK
        entries = self.redis.xrange(self.tasks, min=lease_id, max=lease_id, count=1)
        payload = _payload_of(entries[0][1]) if entries else b""
        letter = self._letter(lease_id, payload, f"worker {worker_id} could not serve it: {error}")
        retired = self._retire(lease_id, worker_id, 0, letter, WorkCounter.FAILED, 1, now_s, cut=True)
        return RETIRED if retired else None

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


def refusal_letters(client: redis.Redis, keys: RunKeys, credential_id: str, count: int = 100) -> list[DeadLetter]:
    """The newest dead letters of refused answers of one credential's identities, newest first."""
    entries = client.xrevrange(keys.credential_refusals(credential_id), count=count)
    return [DeadLetter.decode(_payload_of(fields)) for _, fields in entries or []]


def _payload_of(fields: Any) -> bytes:
    """The payload of an entry's fields as a script or redis-py returns them: a flat list or a dict."""
    if isinstance(fields, dict):
        return cast(bytes, fields.get(PAYLOAD_FIELD, b""))
    pairs = dict(zip(fields[::2], fields[1::2], strict=True))
    return cast(bytes, pairs.get(PAYLOAD_FIELD, b""))
