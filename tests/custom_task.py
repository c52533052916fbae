"""A task defined outside shared/tasks, as a user's own package would: the run file names it by import
path, `[task] name = "tests.custom_task:ShoutTask"` (docs/tasks.md)."""

from __future__ import annotations

from shared.tasks import TaskAdapter, TaskPrompt

WORDS = ("ab", "ba", "abc", "cab", "bca", "cc", "aab", "bba", "acb", "cba", "bac", "ca")


class ShoutTask(TaskAdapter):
    """`ab!` -> `AB`: upper-case the word; half credit for the right letters in the wrong case."""

    name = "shout"
    alphabet = "abcABC!"

    def all_prompts(self) -> list[TaskPrompt]:
        return [TaskPrompt(f"{word}!", word.upper()) for word in WORDS]

    def score(self, completion: str, reference: str) -> float:
        if completion == reference:
            return 1.0
        return 0.5 if completion.upper() == reference else 0.0


class NotATask:
    name = "not_a_task"
    alphabet = "x"


class NamelessTask(ShoutTask):
    name = ""
