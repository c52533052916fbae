"""Eval tasks as the reward service issues them for an EvalRequest (services/reward/evaluation.py): the version's
eval tasks on their own stream, with its consumer group, and its open evaluation's state, without a reward service."""

from __future__ import annotations

import uuid

from shared.bus import StreamBus
from shared.messages import TaskGroup
from shared.streams import eval_tasks


def issue_evals(bus: StreamBus, version: int, prompts: list[str], max_new_tokens: int = 2) -> list[TaskGroup]:
    tasks = [
        TaskGroup(
            run_id=bus.keys.run_id,
            task_id=uuid.uuid4().hex,
            task_name="arithmetic_mod10",
            prompt=prompt,
            num_samples=1,
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            min_policy_version=version,
            eval_version=version,
        )
        for prompt in prompts
    ]
    bus.ensure_group(eval_tasks(version))
    bus.redis.hset(bus.keys.eval_state(version), mapping={"request_id": "r", "num_prompts": len(tasks)})
    for task in tasks:
        bus.publish(eval_tasks(version), task)
    return tasks
