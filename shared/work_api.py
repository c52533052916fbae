"""The work API's contract: how a rollout worker takes tasks and hands back groups without touching Redis.

Producer: the coordinator (services/coordinator/routers/work.py, services/coordinator/work_leases.py), which
does every stream operation on a worker's behalf after its checks. Consumer: rollout workers
(services/rollout/work_client.py); the accounting also feeds operators and the dashboard.

    POST /v1/work/lease      LeaseRequest (JSON)            -> LeaseResponse: tasks leased to the caller
    POST /v1/work/rollouts   WorkSubmission (msgpack)       -> SubmitResponse: per lease, accepted or refused
    POST /v1/work/failures   TaskFailure (JSON)             -> 204: the task is dead-lettered and acked
    GET  /v1/work/accounting (admin)                        -> WorkAccounting: counters per worker and in total

A lease id is the entry id of the task on the `tasks` stream. Every call carries the worker's bearer
token; a lease belongs to the worker whose token took it, until it is answered or its lease time
(the run file's `rollout.claim_idle_ms`) runs out and another worker takes it. A worker holds at most
`[work] max_held_tasks` leases at once.

Eval tasks (held-out evaluation by the workers, docs/evaluation.md#where-evaluation-runs) travel the same
routes: a lease call that names the engine's `policy_version` gets that exact version's eval tasks first (a
TaskGroup with `eval_version` set, its lease id an entry of `eval_tasks:<version>`), then training tasks as
ever. The answer names `eval_version` (SubmittedGroup) and goes to `eval_rollouts`, never `rollouts`; a
failure report naming it gives the eval lease back without penalty. They are counted apart (EvalCounter) and
held apart from `[work] max_held_tasks` (at most MAX_GROUPS_PER_LEASE eval leases of one version per worker).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shared.api import Body, RequestBody, Text, WorkCounts
from shared.bounded_msgpack import DecodeLimits
from shared.config import RunConfig
from shared.messages import Message, MessageDecodeError, RolloutGroup, TaskGroup
from shared.rollout_limits import MAX_GROUP_BYTES, MAX_ID_STR_BYTES, RolloutLimits, largest_group_bytes

LEASE_PATH = "/v1/work/lease"
ROLLOUTS_PATH = "/v1/work/rollouts"
FAILURES_PATH = "/v1/work/failures"
ACCOUNTING_PATH = "/v1/work/accounting"
MSGPACK_CONTENT_TYPE = "application/msgpack"

MAX_GROUPS_PER_LEASE = 64
MAX_GROUPS_PER_SUBMISSION = 64
# MAX_GROUP_BYTES (shared/rollout_limits.py): one encoded RolloutGroup at most.
# POST /v1/work/rollouts' body limit is the run's `max_submission_bytes`, between these two (every other route
# keeps services/coordinator/body_limit.py's 64 KiB); a client splits a larger batch into several submissions
# of at most MAX_SUBMISSION_BYTES (services/rollout/work_client.py), which never pass the run's limit.
MAX_SUBMISSION_BYTES = 16 * 1024 * 1024
MIN_SUBMISSION_BYTES = 1024 * 1024
SUBMISSION_OVERHEAD_BYTES = 64 * 1024  # the envelope and msgpack headers around the groups, with room to spare
SUBMITTED_GROUP_OVERHEAD_BYTES = 128  # a group's map, keys, lease id and bin header (~64 bytes), with room
MAX_ERROR_CHARS = 2000
MAX_STREAM_ID_PART = 2**64 - 1


def _stream_id(text: str) -> str:
    milliseconds, _, sequence = text.partition("-")
    if int(milliseconds) > MAX_STREAM_ID_PART or int(sequence) > MAX_STREAM_ID_PART:
        raise ValueError("not a Redis stream id: a part is over 2**64 - 1")
    return text


# "<ms>-<seq>", both parts unsigned 64-bit: anything else is refused before it reaches Redis
LeaseId = Annotated[str, Field(pattern=r"^[0-9]{1,20}-[0-9]{1,20}$"), AfterValidator(_stream_id)]


class LeaseRequest(RequestBody):
    max_groups: int = Field(ge=1, le=MAX_GROUPS_PER_LEASE, description="tasks wanted at most")
    policy_version: int | None = Field(
        None,
        ge=0,
        description="the version of the weights the caller's engine holds and will decode eval tasks with: that "
        "version's eval tasks are leased first (None: none)",
    )
    max_eval_groups: int = Field(
        0, ge=0, le=MAX_GROUPS_PER_LEASE, description="eval tasks wanted at most, besides max_groups training tasks"
    )


class LeasedTask(Body):
    lease_id: str = Field(description="the task's entry id on `tasks`: name it when answering")
    task: TaskGroup


class LeaseResponse(Body):
    """Tasks leased to the caller, maybe none (then back off before asking again). Only an active worker
    gets any: standby, draining and quarantined workers get an empty list, a dead one 410; one holding
    `[work] max_held_tasks` unanswered leases gets none until it answers some (fewer when it is close)."""

    lease_s: float = Field(description="seconds the worker has to answer before a task may go to another worker")
    tasks: list[LeasedTask]


class SubmittedGroup(BaseModel):
    """One answer: the lease it answers and the RolloutGroup, msgpack-encoded (decoded and checked on its
    own, so one malformed group is refused alone)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    lease_id: LeaseId
    group: bytes = Field(max_length=MAX_GROUP_BYTES, description="RolloutGroup.encode()")
    eval_version: int | None = Field(None, ge=0, description="an eval task's answer: the task's eval_version")

    def decode_group(self, task: TaskGroup | str | None) -> RolloutGroup:
        """The RolloutGroup, decoded within the limits of the task it answers (shared/rollout_limits.py), or of
        any task when that cannot be read (`task` is why, or None: the answer is refused then anyway). Raises
        MessageDecodeError naming the limit it breaks."""
        limits = RolloutLimits.for_task(task) if isinstance(task, TaskGroup) else RolloutLimits.any_task()
        group = RolloutGroup.decode(self.group, limits.decode_limits)
        try:
            limits.check(group)
        except ValueError as exc:
            raise MessageDecodeError(f"RolloutGroup: {exc}") from exc
        return group


class WorkSubmission(Message):
    """POST /v1/work/rollouts, body `application/msgpack`. Producer: a rollout worker. Consumer: the
    coordinator, which puts each accepted group on `rollouts` and acks its task in one atomic step."""

    groups: list[SubmittedGroup] = Field(min_length=1, max_length=MAX_GROUPS_PER_SUBMISSION)


# A WorkSubmission's body as the coordinator decodes it: a map of scalars and `groups`, a list of maps of
# scalars (depth 3); its groups' bytes stay opaque until each is decoded on its own (SubmittedGroup.decode_group).
SUBMISSION_DECODE_LIMITS = DecodeLimits(
    max_depth=3,
    max_items=len(WorkSubmission.model_fields) + MAX_GROUPS_PER_SUBMISSION * (1 + len(SubmittedGroup.model_fields)),
    max_array_len=MAX_GROUPS_PER_SUBMISSION,
    max_map_len=max(len(WorkSubmission.model_fields), len(SubmittedGroup.model_fields)),
    max_str_bytes=MAX_ID_STR_BYTES,
    max_bin_bytes=MAX_GROUP_BYTES,
)


def max_submission_bytes(run: RunConfig) -> int:
    """POST /v1/work/rollouts' body limit for `run`: MAX_GROUPS_PER_SUBMISSION of its largest honest groups
    (shared/rollout_limits.py largest_group_bytes) in one body, between MIN_SUBMISSION_BYTES and
    MAX_SUBMISSION_BYTES. A client that splits by MAX_SUBMISSION_BYTES never passes it: its bodies hold at most
    that many groups, each at most that large."""
    group_bytes = largest_group_bytes(run) + SUBMITTED_GROUP_OVERHEAD_BYTES
    largest = SUBMISSION_OVERHEAD_BYTES + MAX_GROUPS_PER_SUBMISSION * group_bytes
    return max(MIN_SUBMISSION_BYTES, min(MAX_SUBMISSION_BYTES, largest))


class Refusal(Body):
    lease_id: str
    reason: str = Field(description="why the group was refused; it was dead-lettered, its lease left as it was")


class SubmitResponse(Body):
    accepted: list[str] = Field(description="lease ids whose group went on to `rollouts` (their tasks are done)")
    refused: list[Refusal]


class TaskFailure(RequestBody):
    """POST /v1/work/failures: the worker cannot serve this task (an engine error); it is dead-lettered with
    `error` and acked, never reissued."""

    lease_id: LeaseId
    error: Text = Field(min_length=1, max_length=MAX_ERROR_CHARS)
    eval_version: int | None = Field(
        None, ge=0, description="an eval lease (of this version): given back to other workers, without penalty"
    )


class RewardStats(Body):
    """The groups of one worker the reward service scored (shared/worker_rewards.py): their number, and the sum
    and sum of squares of each group's mean reward."""

    num_groups: int = Field(0, ge=0)
    reward_sum: float = 0.0
    reward_sum_sq: float = Field(0.0, ge=0)
    num_rejected: int = Field(0, ge=0, description="groups of the worker the reward service dead-lettered instead")

    @property
    def mean(self) -> float | None:
        return self.reward_sum / self.num_groups if self.num_groups else None

    @property
    def variance(self) -> float | None:
        """The sample variance of the group means (None under two groups)."""
        if self.num_groups < 2:
            return None
        spread = self.reward_sum_sq - self.reward_sum * self.reward_sum / self.num_groups
        return max(0.0, spread / (self.num_groups - 1))


class EvalWorkCounts(Body):
    """The work API's eval-task counters (shared/work_counts.py EvalCounter) of a worker or the run."""

    leased: int = Field(0, ge=0)
    accepted: int = Field(0, ge=0)
    refused: int = Field(0, ge=0)
    expired: int = Field(
        0, ge=0, description="eval leases another worker at the version took over after the lease time"
    )
    given_back: int = Field(0, ge=0, description="eval leases handed back (version moved on, engine error)")


class WorkAccounting(Body):
    """GET /v1/work/accounting (admin): what the work API saw arrive, per worker and over the run."""

    lease_s: float
    max_held: int = Field(0, ge=0, description="leases one worker may hold at once ([work] max_held_tasks)")
    workers: dict[str, WorkCounts] = Field(description="by worker id: every worker that ever leased a task")
    totals: WorkCounts
    flagged: dict[str, str] = Field(
        default_factory=dict,
        description="worker id -> why its completion ratio, over the leases ended since its last release, departs "
        "from the fleet's (services/coordinator/work_flags.py); the coordinator quarantines these by policy",
    )
    rewards: dict[str, RewardStats] = Field(
        default_factory=dict, description="by worker id: the groups the reward service scored for it"
    )
    reward_flagged: dict[str, str] = Field(
        default_factory=dict,
        description="worker id -> why its mean group reward departs from the rest of the fleet's: a signal for an "
        "operator, never acted on (docs/threat_model.md)",
    )
    eval_workers: dict[str, EvalWorkCounts] = Field(
        default_factory=dict, description="by worker id: its eval-task counters (workers that leased one)"
    )
    eval_totals: EvalWorkCounts = Field(default_factory=EvalWorkCounts, description="eval-task counters of the run")
