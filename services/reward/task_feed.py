"""The data plane's producer side: keep the `tasks` stream shallow.

Backpressure: the number of groups somewhere in the pipeline (tasks not finished by a worker,
rollouts not finished by this service, scored groups the learner has not read yet) is held at
`max_groups_in_flight` (default groups_per_step * max(1, S - 1), see RunConfig.max_groups_in_flight):
enough to keep the learner's next batch in the making, never so much that groups wait long enough
to go stale.
"""

from __future__ import annotations

import uuid

from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import EnvironmentSpec, TaskGroup
from shared.streams import ROLLOUTS, SCORED, TASKS
from shared.tasks import TaskAdapter
from shared.tasks.environment import EnvironmentTask


def groups_in_flight(bus: StreamBus) -> int:
    """Groups produced but not yet read by the learner."""
    tasks_lag, tasks_pending = bus.group_progress(TASKS)
    rollouts_lag, rollouts_pending = bus.group_progress(ROLLOUTS)
    scored_lag, _ = bus.group_progress(SCORED)  # pending there = trained, awaiting checkpoint
    return tasks_lag + tasks_pending + rollouts_lag + rollouts_pending + scored_lag


def top_up_tasks(bus: StreamBus, keys: RunKeys, task: TaskAdapter, run: RunConfig, reference_ttl_s: int) -> int:
    """Publish tasks until the pipeline holds `run.max_groups_in_flight` groups; returns how many were added."""
    num_missing = run.max_groups_in_flight - groups_in_flight(bus)
    for _ in range(max(0, num_missing)):
        prompt = task.sample_prompt()
        message = TaskGroup(
            run_id=run.run_id,
            task_id=uuid.uuid4().hex,
            task_name=task.name,
            prompt=prompt.prompt,
            messages=list(prompt.messages),
            num_samples=run.grpo.group_size,
            max_new_tokens=run.grpo.max_new_tokens,
            temperature=run.grpo.temperature,
            # multi-turn: the workers play the episode from the prompt's state (no secret: the reward is the replay's)
            environment=EnvironmentSpec(state=prompt.reference, max_turns=task.max_turns)
            if isinstance(task, EnvironmentTask)
            else None,
        )
        # The reference is stored before the task exists, so a rollout can always be scored; with it
        # a raw-text prompt, which the prompt ids of its rollouts must encode (chat prompts: not checked).
        writes = bus.redis.pipeline(transaction=False)
        writes.set(keys.task_reference(message.task_id), prompt.reference.encode(), ex=reference_ttl_s)
        if not prompt.messages:
            writes.set(keys.task_prompt(message.task_id), prompt.prompt.encode(), ex=reference_ttl_s)
        writes.execute()
        bus.publish(TASKS, message)
    return max(0, num_missing)
