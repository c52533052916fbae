"""`a+b=` -> the last digit of a + b. A tiny model starting at chance (1 in ~15 tokens) learns it on a
CPU in minutes and generalises to held-out pairs (docs/design.md#the-arithmetic-task-learns-on-a-cpu-in-minutes)."""

from __future__ import annotations

from shared.tasks.base import TaskAdapter, TaskPrompt


class ArithmeticMod10Task(TaskAdapter):
    name = "arithmetic_mod10"
    alphabet = "0123456789+="

    def all_prompts(self) -> list[TaskPrompt]:
        return [TaskPrompt(f"{a}+{b}=", str((a + b) % 10)) for a in range(10) for b in range(10)]

    def score(self, completion: str, reference: str) -> float:
        # Full credit for exactly the digit; half for the right digit followed by junk (it did not
        # stop), which keeps a gradient towards EOS without rewarding a wrong answer.
        if completion == reference:
            return 1.0
        if completion.startswith(reference):
            return 0.5
        return 0.0
