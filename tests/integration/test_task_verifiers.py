"""The math verifier on pathological input, in the verifier's child process under its hard timeout
(shared/verifier_pool.py): math-verify's own timeout is off (it needs the main thread's signal.alarm), so
the process is the only bound."""

from __future__ import annotations

import time

import pytest

from shared.config import TaskConfig
from shared.verifier_pool import VerifierFailedError, VerifierPool

pytestmark = pytest.mark.integration

# SymPy expands the tower of powers and never returns (measured: still running after 120 s)
POWER_TOWER = "\\boxed{9^{9^{9^{9^{9}}}}}"


def test_a_math_answer_that_hangs_sympy_times_out_and_the_next_group_is_scored() -> None:
    pool = VerifierPool(TaskConfig(name="math_gym", size=12, num_eval_prompts=2), timeout_s=3.0).start()
    try:
        started_s = time.monotonic()
        with pytest.raises(VerifierFailedError, match="verifier timeout") as failed:
            pool.score(["\\boxed{1}", POWER_TOWER], "1")
        assert failed.value.kind == "timeout"
        assert time.monotonic() - started_s < 30  # killed after 3 s, replaced by a fresh child
        assert pool.num_replaced == 1
        assert pool.score(["\\boxed{0.5}", "\\boxed{2}", "1" * 100_000], "\\frac{1}{2}") == [1.0, 0.0, 0.0]
    finally:
        pool.close()
