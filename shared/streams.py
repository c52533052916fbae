"""Every channel between services on Redis, one typed descriptor each: which stream (or key), which
consumer group reads it, and which message travels on it. Producer -> consumer is named above each.

Names are suffixes under the run prefix `rl:<run_id>:` (`RunKeys.name_of` gives the full name), so
runs, and tests, which use a fresh run id each, never share state. The bus (shared/bus.py) takes
these descriptors, so a call site cannot pair a stream with the wrong group or message type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shared.messages import (
    BatchRequest,
    DeadLetter,
    EvalRequest,
    EvalScores,
    LearnerState,
    Message,
    QuarantinedWorkers,
    RolloutGroup,
    ScoredGroup,
    TaskGroup,
    WeightsPublished,
)

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Stream(Generic[M]):
    """A Redis stream carrying `message_type` entries, read by consumer group `group` (one group per
    consuming service), or by plain range reads when `group` is None (nobody acks its entries)."""

    name: str
    group: str | None
    message_type: type[M]


@dataclass(frozen=True)
class StateKey(Generic[M]):
    """A single Redis key holding the latest `message_type` value (overwritten, never appended)."""

    name: str
    message_type: type[M]


# reward (data plane) -> rollout workers: prompts to sample groups for
TASKS: Stream[TaskGroup] = Stream("tasks", "rollout", TaskGroup)

# rollout workers -> reward: sampled groups with behaviour logprobs
ROLLOUTS: Stream[RolloutGroup] = Stream("rollouts", "reward", RolloutGroup)

# reward -> learner: groups with one reward per sample
SCORED: Stream[ScoredGroup] = Stream("scored", "learner", ScoredGroup)

# learner -> rollout workers, coordinator: announcements that a version can be fetched; read newest
# first without a group (every reader wants the latest, none consumes)
WEIGHTS: Stream[WeightsPublished] = Stream("weights", None, WeightsPublished)

# any consumer -> people (and tests): entries that could not be decoded or kept failing
DEAD: Stream[DeadLetter] = Stream("dead", None, DeadLetter)

# learner -> coordinator, local cluster runner: the learner's latest state
LEARNER_STATE: StateKey[LearnerState] = StateKey("learner:state", LearnerState)

# learner -> reward (pull mode only): the groups its next step still needs, at which version
BATCH_REQUEST: StateKey[BatchRequest] = StateKey("learner:batch_request", BatchRequest)

# coordinator -> learner: the quarantined workers (docs/trust.md) and each one's admin releases
QUARANTINE: StateKey[QuarantinedWorkers] = StateKey("trust:quarantine", QuarantinedWorkers)

# Held-out evaluation by the workers (docs/evaluation.md#where-evaluation-runs), beside the training path and
# never on it: learner -> reward, one request per evaluated version
EVAL_REQUESTS: Stream[EvalRequest] = Stream("eval_requests", "reward", EvalRequest)

# coordinator (a worker's accepted answer to an eval task) -> reward: greedy groups of one sample
EVAL_ROLLOUTS: Stream[RolloutGroup] = Stream("eval_rollouts", "reward", RolloutGroup)

# reward -> learner: one version's evaluation, every held-out prompt scored
EVAL_SCORES: Stream[EvalScores] = Stream("eval_scores", "learner", EvalScores)


def eval_tasks(policy_version: int) -> Stream[TaskGroup]:
    """reward -> rollout workers, leased by the coordinator only to a worker whose engine holds exactly
    `policy_version`: the version's eval tasks, one per held-out prompt; deleted when its evaluation is done or
    abandoned (services/reward/evaluation.py)."""
    return Stream(f"eval_tasks:{policy_version}", "rollout", TaskGroup)


# the streams consumed through a group, in pipeline order; their depth (the group's unfinished
# entries) is what /v1/status and /metrics report
GROUPED_STREAMS: tuple[Stream[Any], ...] = (TASKS, ROLLOUTS, SCORED)
