"""The data plane's consumer side: turn a rollout group into a scored group with the task's verifier."""

from __future__ import annotations

import redis

from shared.keys import RunKeys
from shared.messages import RolloutGroup, ScoredGroup
from shared.tasks import TaskAdapter


class UnscorableGroupError(ValueError):
    """A rollout this service cannot score (unknown task, wrong task name): dead-lettered with the reason."""


def score_group(group: RolloutGroup, task: TaskAdapter, redis_client: redis.Redis, keys: RunKeys) -> ScoredGroup:
    if group.task_name != task.name:
        raise UnscorableGroupError(
            f"group {group.group_id} is for task {group.task_name!r}, this run scores {task.name!r}"
        )
    reference = redis_client.get(keys.task_reference(group.task_id))
    if reference is None:
        raise UnscorableGroupError(f"no reference for task {group.task_id} (never issued by this run, or expired)")
    reference_text = reference.decode() if isinstance(reference, bytes) else str(reference)
    rewards = [task.score(text, reference_text) for text in group.completion_texts]
    return ScoredGroup(run_id=group.run_id, rollout=group, rewards=rewards)
