"""A task whose verifier never returns (as math-verify does on some inputs): evaluation must count its
prompts as wrong within the verifier's timeout instead of hanging the learner's eval thread."""

from __future__ import annotations

from shared.tasks.arithmetic import ArithmeticMod10Task


class HangingTask(ArithmeticMod10Task):
    """arithmetic_mod10's prompts; `score` spins forever (in the verifier's process, which is killed)."""

    name = "arithmetic_hanging"

    def score(self, completion: str, reference: str) -> float:
        while True:
            pass
