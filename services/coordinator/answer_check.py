"""The checks every answer to a lease passes, a rollout's (services/coordinator/work_leases.py) or an eval
task's (services/coordinator/eval_leases.py, which adds its own)."""

from __future__ import annotations

from shared.messages import MessageDecodeError, RolloutGroup, TaskGroup
from shared.work_api import SubmittedGroup


def check_answer(
    run_id: str, worker_id: str, submitted: SubmittedGroup, task: TaskGroup | str | None, no_task: str
) -> RolloutGroup | str:
    """The checks every answer passes, rollout or eval (services/coordinator/eval_leases.py adds its own): the
    group decodes within its task's limits (shared/rollout_limits.py) and names this run, the caller and the
    leased task; else why not (`no_task`: the reason when the lease has no task)."""
    try:
        group = submitted.decode_group(task)
    except MessageDecodeError as exc:
        return f"malformed group: {str(exc)[:500]}"
    if isinstance(task, str):
        return task
    if task is None:
        return no_task
    if group.run_id != run_id:
        return f"group of run {group.run_id[:128]!r}, not {run_id!r}"
    if group.worker_id != worker_id:
        return f"group claims worker {group.worker_id!r}, not the caller"
    if group.task_id != task.task_id or group.task_name != task.task_name:
        return f"group answers task {group.task_id!r}, the lease is task {task.task_id!r}"
    return group
