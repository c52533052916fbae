"""A task whose verifier is broken on pathological input, as user code can be: the reward service must
fail such a group with a reason, within its timeout, and keep scoring the others.

`arithmetic_trap` is arithmetic_mod10 (same prompts and scores) except on completions that start with
`+`, where the verifier hangs in a catastrophically backtracking regex (about 2**40 steps: a thread
running it cannot be stopped), and `=`, where it raises; `=+` kills the verifier's process, `==`
scores NaN."""

from __future__ import annotations

import os
import re

from shared.tasks.arithmetic import ArithmeticMod10Task

HANG_PREFIX = "+"
RAISE_PREFIX = "="
EXIT_TEXT = "=+"  # the verifier's process exits on the spot
NAN_TEXT = "=="  # the verifier returns NaN


class TrapTask(ArithmeticMod10Task):
    name = "arithmetic_trap"

    def score(self, completion: str, reference: str) -> float:
        if completion == EXIT_TEXT:
            os._exit(3)
        if completion == NAN_TEXT:
            return float("nan")
        if completion.startswith(HANG_PREFIX):
            re.match(r"(a+)+$", "a" * 40 + "b")  # never returns in practice
        if completion.startswith(RAISE_PREFIX):
            raise ValueError(f"cannot parse {completion!r}")
        return super().score(completion, reference)
