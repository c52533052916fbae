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
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shared.api import Body, RequestBody, Text
from shared.messages import Message, TaskGroup

LEASE_PATH = "/v1/work/lease"
ROLLOUTS_PATH = "/v1/work/rollouts"
FAILURES_PATH = "/v1/work/failures"
ACCOUNTING_PATH = "/v1/work/accounting"
MSGPACK_CONTENT_TYPE = "application/msgpack"

MAX_GROUPS_PER_LEASE = 64
MAX_GROUPS_PER_SUBMISSION = 64
# One encoded RolloutGroup: 64 samples x 4,096 tokens x 8 bytes (id + log-prob) is 2 MiB, plus texts.
MAX_GROUP_BYTES = 4 * 1024 * 1024
# POST /v1/work/rollouts' body limit (every other route keeps services/coordinator/body_limit.py's 64 KiB);
# a client splits a larger batch into several submissions (services/rollout/work_client.py).
MAX_SUBMISSION_BYTES = 16 * 1024 * 1024
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


class WorkSubmission(Message):
    """POST /v1/work/rollouts, body `application/msgpack`. Producer: a rollout worker. Consumer: the
    coordinator, which puts each accepted group on `rollouts` and acks its task in one atomic step."""

    groups: list[SubmittedGroup] = Field(min_length=1, max_length=MAX_GROUPS_PER_SUBMISSION)


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


class WorkCounts(Body):
    """The counters of shared/work_counts.py, plus the leases held now (for the closing identity)."""

    leased: int = Field(0, ge=0)
    returned: int = Field(0, ge=0)
    accepted: int = Field(0, ge=0)
    refused: int = Field(0, ge=0)
    expired: int = Field(0, ge=0)
    failed: int = Field(0, ge=0)
    held: int = Field(0, ge=0, description="leases held now, not yet answered nor expired and reissued")

    @property
    def num_unaccounted(self) -> int:
        """leased - (accepted + failed + expired + held): 0 when every lease is accounted for."""
        return self.leased - (self.accepted + self.failed + self.expired + self.held)

    @property
    def num_decided(self) -> int:
        """Leases that ended: answered, failed or expired."""
        return self.accepted + self.failed + self.expired

    @property
    def completion_ratio(self) -> float | None:
        """Of the leases that ended, the fraction answered with an accepted group (None: none ended yet)."""
        return self.accepted / self.num_decided if self.num_decided else None


class RewardStats(Body):
    """The groups of one worker the reward service scored (shared/worker_rewards.py): their number, and the sum
    and sum of squares of each group's mean reward."""

    num_groups: int = Field(0, ge=0)
    reward_sum: float = 0.0
    reward_sum_sq: float = Field(0.0, ge=0)

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
