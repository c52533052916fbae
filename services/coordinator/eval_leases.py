"""Eval tasks leased to workers, and their answers: the work API's side of held-out evaluation by the workers
(docs/evaluation.md#where-evaluation-runs; the contract: shared/work_api.py; the scripts: work_scripts.py).

The reward service puts one eval task per held-out prompt on `eval_tasks:<v>` (services/reward/evaluation.py);
the coordinator leases them only to a caller that names version v, the version its engine holds, and before
its training tasks (services/coordinator/routers/work.py). Each operation is one Lua script:

    lease      the caller is active and its credential not quarantined (as for training tasks); eval leases of
               v that others gave back or let pass the lease time first, then new ones; at most
               MAX_GROUPS_PER_LEASE of v held by one worker. Counted eval_leased (and eval_expired for the
               holder whose lease was taken over); the first lease of v stamps `first_leased_at_s`
    answer     checked like a rollout (the caller holds the lease, the group decodes within the task's limits,
               names this run, the caller and the task) and more: sampled entirely with version v, one sample,
               single-turn. Accepted: on to `eval_rollouts` (never `rollouts`) and acked; refused: its dead
               letter in the caller's credential's refusals. Counted eval_accepted / eval_refused
    give back  the caller's version moved past v, or its engine cannot serve the prompt: the lease goes back to
               the version's other workers, counted eval_given_back: no dead letter, no failure, no allowance cut

Nothing here touches a training lease, an allowance, a credential's `held` or the speculative set, so the run's
task accounting (cluster/accounting.py) and its invariants are what they were without eval tasks. The producer
MAC of an accepted group is checked by the reward service, as for rollouts (services/reward/provenance.py).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.typing import EncodableT

from services.coordinator import work_scripts
from services.coordinator.answer_check import check_answer
from services.coordinator.work_scripts import EVAL_GIVEN_BACK
from shared.bus import PAYLOAD_FIELD, redis_text
from shared.keys import RunKeys
from shared.messages import DeadLetter, MessageDecodeError, RolloutGroup, TaskGroup
from shared.streams import EVAL_ROLLOUTS, eval_tasks
from shared.work_api import MAX_GROUPS_PER_LEASE, LeasedTask, Refusal, SubmittedGroup

log = logging.getLogger(__name__)

SERVICE = "coordinator-work-api"
MAX_REFUSAL_PAYLOAD_BYTES = 512  # as a training answer's refusal (services/coordinator/work_leases.py)
REFUSALS_KEPT = 200
ANSWERED_TTL_S = 600
NOT_HELD = "the eval lease is not held by this worker (never leased to it, given back, taken over, or answered)"


@dataclass(frozen=True)
class EvalLeaseReply:
    state: str  # 'active', or why the caller may not lease (as the training lease's)
    tasks: list[LeasedTask]


class EvalLeases:
    """The work API's eval-task operations for one run. `lease_ms`: how long a worker has to answer one."""

    def __init__(self, client: redis.Redis, keys: RunKeys, *, lease_ms: int) -> None:
        self.redis = client
        self.keys = keys
        self.lease_ms = lease_ms
        self.group = cast(str, eval_tasks(0).group)
        self.eval_rollouts = keys.name_of(EVAL_ROLLOUTS)
        self._lease_script = client.register_script(work_scripts.LEASE_EVAL)
        self._answer_script = client.register_script(work_scripts.ANSWER_EVAL)
        self._give_back_script = client.register_script(work_scripts.GIVE_BACK_EVAL)

    def lease(self, worker_id: str, policy_version: int, max_groups: int, now_s: float) -> EvalLeaseReply:
        """Up to `max_groups` eval tasks of `policy_version` for `worker_id` (none when the version has none)."""
        k = self.keys
        keys = [self.stream(policy_version), k.worker(worker_id), k.worker_leases, k.work_counts(worker_id)]
        keys += [k.work_totals, k.work_worker_ids, k.eval_state(policy_version)]
        args: list[EncodableT] = [self.group, worker_id, repr(now_s), self.lease_ms, max_groups, MAX_GROUPS_PER_LEASE]
        args += [k.operator(""), k.operator_quarantine(""), EVAL_GIVEN_BACK, k.work_counts("")]
        reply = self._lease_script(keys=keys, args=args)
        state = redis_text(reply[0])
        if state != "active":
            return EvalLeaseReply(state, [])
        leased: list[LeasedTask] = []
        for raw_id, fields in reply[1]:
            entry_id = redis_text(raw_id)
            try:
                task = TaskGroup.decode(_payload_of(fields))
            except MessageDecodeError as exc:  # the reward service wrote it: a bug, never a worker's doing
                log.error("undecodable eval task %s of version %d: %s", entry_id, policy_version, exc)
                continue
            leased.append(LeasedTask(lease_id=entry_id, task=task))
        return EvalLeaseReply(state, leased)

    def submit(self, worker_id: str, groups: Sequence[SubmittedGroup]) -> tuple[list[str], list[Refusal]]:
        """Each eval answer checked, then accepted or refused in one script call (module doc)."""
        accepted: list[str] = []
        refused: list[Refusal] = []
        for submitted in groups:
            version = cast(int, submitted.eval_version)
            checked = self._check(worker_id, submitted, version, self._read_task(version, submitted.lease_id))
            if isinstance(checked, RolloutGroup):
                payload, refuse = checked.encode(), ""
            else:
                payload, refuse = self._letter(worker_id, submitted, checked), "1"
            k = self.keys
            keys = [self.stream(version), self.eval_rollouts, k.work_counts(worker_id), k.work_totals]
            keys += [k.work_worker_ids, k.worker(worker_id), k.work_answered(f"eval-{version}-{submitted.lease_id}")]
            args: list[EncodableT] = [self.group, worker_id, submitted.lease_id, refuse, payload]
            args.append(self._letter(worker_id, submitted, NOT_HELD))
            args += [f"{worker_id}:{hashlib.sha256(submitted.group).hexdigest()}", ANSWERED_TTL_S]
            args += [k.work_counts(""), k.credential_prefix, REFUSALS_KEPT]
            done, outcome = self._answer_script(keys=keys, args=args)
            if int(done):
                accepted.append(submitted.lease_id)
                continue
            reason = NOT_HELD if redis_text(outcome) == "not-held" else cast(str, checked)
            refused.append(Refusal(lease_id=submitted.lease_id, reason=reason))
            log.info(
                "refused an eval answer of %s to lease %s (version %d): %s",
                worker_id,
                submitted.lease_id,
                version,
                reason,
            )
        return accepted, refused

    def give_back(self, worker_id: str, policy_version: int, lease_id: str) -> bool:
        """Hand an eval lease back to the version's other workers, without penalty. False: not held by the caller."""
        k = self.keys
        given_back = self._give_back_script(
            keys=[self.stream(policy_version), k.work_counts(worker_id), k.work_totals],
            args=[self.group, lease_id, worker_id, self.lease_ms, EVAL_GIVEN_BACK],
        )
        return bool(int(given_back))

    def stream(self, policy_version: int) -> str:
        return self.keys.name_of(eval_tasks(policy_version))

    def _check(
        self, worker_id: str, submitted: SubmittedGroup, version: int, task: TaskGroup | str | None
    ) -> RolloutGroup | str:
        """The group, if its content may answer the eval lease; else why not."""
        group = check_answer(
            self.keys.run_id, worker_id, submitted, task, f"no eval task {submitted.lease_id} of version {version}"
        )
        if isinstance(group, str):
            return group
        if group.policy_version != version or group.newest_version != version:
            return f"an eval task of version {version} answered with version {group.policy_version}..{group.newest_version}"
        if group.num_samples != 1 or group.is_masked:
            return f"an eval answer is one single-turn sample, not {group.num_samples}"
        return group

    def _read_task(self, version: int, entry_id: str) -> TaskGroup | str | None:
        entries = self.redis.xrange(self.stream(version), min=entry_id, max=entry_id, count=1)
        if not entries:
            return None
        try:
            return TaskGroup.decode(_payload_of(entries[0][1]))
        except MessageDecodeError as exc:
            return f"the leased eval task is undecodable: {exc}"

    def _letter(self, worker_id: str, submitted: SubmittedGroup, reason: str) -> bytes:
        sent = submitted.group
        error = (
            f"eval answer of worker {worker_id} refused: {reason} "
            f"({len(sent)} bytes, sha256 {hashlib.sha256(sent).hexdigest()})"
        )
        return DeadLetter(
            run_id=self.keys.run_id,
            source_stream=self.stream(cast(int, submitted.eval_version)),
            source_message_id=submitted.lease_id,
            consumer_group=self.group,
            service=SERVICE,
            error=error[:4000],
            payload=sent[:MAX_REFUSAL_PAYLOAD_BYTES],
            num_deliveries=0,
        ).encode()


def _payload_of(fields: Any) -> bytes:
    """The payload of an entry's fields as a script (flat list) or redis-py (dict) returns them."""
    if isinstance(fields, dict):
        return cast(bytes, fields.get(PAYLOAD_FIELD, b""))
    pairs = dict(zip(fields[::2], fields[1::2], strict=True))
    return cast(bytes, pairs.get(PAYLOAD_FIELD, b""))
