"""Task adapters (the data plane's pluggable part): a prompt stream, a held-out set, a verifier.

The run file picks one with `[task] name = ...`: either a name registered in `TASKS`, or the import
path of a `TaskAdapter` subclass in the user's own package, `"package.module:ClassName"`, so a task is
added without editing this repository (docs/tasks.md has a short example). The learner, the reward
service and its verifier child all import it: it must be importable where they run.
"""

from __future__ import annotations

import importlib
import logging
import re

from shared.config import TASK_OPTION_FIELDS, TaskConfig
from shared.tasks.arithmetic import ArithmeticMod10Task
from shared.tasks.base import TaskAdapter, TaskPrompt
from shared.tasks.logic import KnightsKnavesTask, MiniSudokuTask
from shared.tasks.math_file import MathFileTask
from shared.tasks.math_gym import MathGymTask
from shared.tasks.poker import KuhnPokerTask
from shared.tasks.reverse import ReverseDigitsTask

log = logging.getLogger(__name__)

TASKS: dict[str, type[TaskAdapter]] = {
    ArithmeticMod10Task.name: ArithmeticMod10Task,
    ReverseDigitsTask.name: ReverseDigitsTask,
    MathGymTask.name: MathGymTask,
    MathFileTask.name: MathFileTask,
    KnightsKnavesTask.name: KnightsKnavesTask,
    MiniSudokuTask.name: MiniSudokuTask,
    KuhnPokerTask.name: KuhnPokerTask,
}
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def task_type(name: str) -> type[TaskAdapter]:
    """The adapter class `name` stands for: a registered name, or `package.module:ClassName`.
    Raises ValueError saying what is wrong (unknown name, module not importable, no such class, not a
    TaskAdapter, no `name`/`alphabet`)."""
    if ":" not in name:
        try:
            return TASKS[name]
        except KeyError:
            raise ValueError(
                f"unknown task {name!r}; registered: {sorted(TASKS)}, or give the import path of your own "
                "TaskAdapter subclass as 'package.module:ClassName'"
            ) from None
    if not IMPORT_PATH.match(name):
        raise ValueError(f"task {name!r} is not an import path of the form 'package.module:ClassName'")
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"task {name!r}: cannot import {module_name!r} ({exc}); is its package installed?") from exc
    found = getattr(module, class_name, None)
    if found is None:
        raise ValueError(f"task {name!r}: module {module_name!r} has no {class_name!r}")
    if not (isinstance(found, type) and issubclass(found, TaskAdapter)):
        raise ValueError(f"task {name!r} is not a subclass of shared.tasks.TaskAdapter")
    for attribute in ("name", "alphabet"):
        if not isinstance(getattr(found, attribute, None), str) or not getattr(found, attribute):
            raise ValueError(f"task {name!r} must set the class attribute {attribute!r} (a non-empty string)")
    return found


def build_task(config: TaskConfig) -> TaskAdapter:
    """The adapter of the run file's [task] section, with the fields it reads; a field set for another task
    is ignored with a warning. Raises ValueError for a bad name or a task that cannot build (a missing file)."""
    adapter = task_type(config.name)
    ignored = sorted((config.model_fields_set & TASK_OPTION_FIELDS) - adapter.config_fields)
    if ignored:
        log.warning("[task] %s ignored: task %s does not read them", ignored, config.name)
    task = adapter.from_config(config)
    if config.prompt_seed is not None:
        task.reseed_prompt_stream(config.prompt_seed)
    return task


def make_task(name: str, *, num_eval_prompts: int, seed: int) -> TaskAdapter:
    """The adapter `name` with the default options (tests, benchmarks); services use build_task."""
    return build_task(TaskConfig(name=name, num_eval_prompts=num_eval_prompts, seed=seed))


__all__ = ["TASKS", "TaskAdapter", "TaskPrompt", "build_task", "make_task", "task_type"]
