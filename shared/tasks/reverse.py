"""`xyz>` -> `zyx`: reverse three digits, with partial credit per digit (exact match alone is too
sparse to learn from at this scale, docs/design.md#the-reverse-task-needs-partial-credit)."""

from __future__ import annotations

from shared.tasks.base import TaskAdapter, TaskPrompt


class ReverseDigitsTask(TaskAdapter):
    name = "reverse_digits"
    alphabet = "0123456789>"

    def all_prompts(self) -> list[TaskPrompt]:
        return [TaskPrompt(f"{n:03d}>", f"{n:03d}"[::-1]) for n in range(1000)]

    def score(self, completion: str, reference: str) -> float:
        matches = sum(1 for got, want in zip(completion, reference, strict=False) if got == want)
        penalty = 0.0 if len(completion) == len(reference) else 0.25
        return max(0.0, matches / len(reference) - penalty)
