"""A task whose scoring waits for a gate the test opens: an evaluation that takes exactly as long as the
test wants (and one that fails on demand), without sleeping."""

from __future__ import annotations

import threading

from shared.tasks.arithmetic import ArithmeticMod10Task


class GatedTask(ArithmeticMod10Task):
    """arithmetic_mod10 (same prompts for the same num_eval_prompts and seed); `score` waits for `gate`,
    then raises if `fail` is set."""

    def __init__(self, *, num_eval_prompts: int, seed: int) -> None:
        super().__init__(num_eval_prompts=num_eval_prompts, seed=seed)
        self.gate = threading.Event()
        self.fail = False

    def score(self, completion: str, reference: str) -> float:
        assert self.gate.wait(timeout=120), "the test never opened the gate"
        if self.fail:
            raise RuntimeError("verifier broke")
        return super().score(completion, reference)
