"""Custom tasks by import path (`[task] name = "package.module:ClassName"`): resolved to the user's
TaskAdapter, and every way of getting it wrong is refused with what is wrong."""

from __future__ import annotations

import pytest

from shared.config import RunConfig
from shared.tasks import TASKS, make_task, task_type
from tests.custom_task import ShoutTask


def test_an_import_path_names_the_users_own_task() -> None:
    assert task_type("tests.custom_task:ShoutTask") is ShoutTask
    task = make_task("tests.custom_task:ShoutTask", num_eval_prompts=3, seed=0)
    assert isinstance(task, ShoutTask) and len(task.eval_set) == 3 and len(task.train_set) == 9
    assert task.score("AB", "AB") == 1.0 and task.score("ab", "AB") == 0.5 and task.score("BA", "AB") == 0.0
    assert task_type("arithmetic_mod10") is TASKS["arithmetic_mod10"]  # registered names as before
    run = RunConfig.model_validate({"run_id": "r", "task": {"name": "tests.custom_task:ShoutTask"}})
    assert task_type(run.task.name) is ShoutTask


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("arithmetic_mod11", "unknown task 'arithmetic_mod11'; registered: .*import path"),
        ("tests.no_such_module:ShoutTask", "cannot import 'tests.no_such_module'"),
        ("tests.custom_task:Missing", "has no 'Missing'"),
        ("tests.custom_task:NotATask", "not a subclass of shared.tasks.TaskAdapter"),
        ("tests.custom_task:NamelessTask", "must set the class attribute 'name'"),
        ("tests/custom_task.py:ShoutTask", "not an import path"),
        ("tests.custom_task:", "not an import path"),
    ],
)
def test_a_wrong_task_is_refused_with_what_is_wrong(name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        task_type(name)
