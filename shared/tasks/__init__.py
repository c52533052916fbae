"""Task adapters (the data plane's pluggable part): a prompt stream, a held-out set, a verifier.

Register new tasks in `TASKS`; the run file picks one by name (`[task] name = ...`).
"""

from __future__ import annotations

from shared.tasks.arithmetic import ArithmeticMod10Task
from shared.tasks.base import TaskAdapter, TaskPrompt
from shared.tasks.reverse import ReverseDigitsTask

TASKS: dict[str, type[TaskAdapter]] = {
    ArithmeticMod10Task.name: ArithmeticMod10Task,
    ReverseDigitsTask.name: ReverseDigitsTask,
}


def make_task(name: str, *, num_eval_prompts: int, seed: int) -> TaskAdapter:
    try:
        task_type = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; registered: {sorted(TASKS)}") from None
    return task_type(num_eval_prompts=num_eval_prompts, seed=seed)


__all__ = ["TASKS", "TaskAdapter", "TaskPrompt", "make_task"]
