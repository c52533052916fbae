"""The task verifiers in their child process (shared/verifier_pool.py): math-verify on pathological input,
where its own timeout is off (it needs the main thread's signal.alarm) and the process is the only bound;
and each math and logic task served and scored by the real reward service."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.bus import StreamBus
from shared.config import RunConfig, TaskConfig
from shared.keys import RunKeys
from shared.rollout_mac import sign_rollout
from shared.streams import ROLLOUTS, SCORED, TASKS
from shared.verifier_pool import VerifierFailedError, VerifierPool
from tests.integration.test_reward_service import TEST_WORKER_ROLLOUT_KEY
from tests.polling import wait_for
from tests.rollouts import unsigned_rollout_for

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


@pytest.fixture(scope="module")
def ascii_policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny-random policy with the chat tasks' alphabet (printable ASCII and the newline)."""
    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tasks.chat import PRINTABLE_ASCII

    model = ModelConfig(init="tiny-random", hidden_size=16, intermediate_size=32, max_position_embeddings=1024)
    return build_initial_policy(model, PRINTABLE_ASCII, tmp_path_factory.mktemp("ascii_policy"))


def right_and_wrong(task_name: str, reference: str) -> tuple[str, str]:
    if task_name.startswith("math"):
        return f"So the answer is \\boxed{{{reference}}}", "\\boxed{123456789}"
    return f"Checked.\n<answer>{json.loads(reference)['answer']}</answer>", "<answer>no idea</answer>"


@pytest.mark.parametrize("name", ["math_gym", "math_file", "knights_knaves", "mini_sudoku"])
def test_the_reward_service_scores_each_task_with_its_verifier(
    name: str, run_id: str, bus: StreamBus, keys: RunKeys, redis_server, ascii_policy_dir: Path, tmp_path: Path
) -> None:
    """The real reward service (its verifier in a child process) serves the task's chat prompts and scores a
    right, a wrong and an empty completion of the first one, from the token ids as a worker sends them."""
    task_fields: dict[str, object] = {"name": name, "num_eval_prompts": 2, "size": 24}
    if name == "math_file":
        path = tmp_path / "problems.jsonl"
        path.write_text("".join(json.dumps({"question": f"{n} + {n}?", "answer": str(2 * n)}) + "\n" for n in range(9)))
        task_fields = {"name": name, "num_eval_prompts": 2, "path": str(path)}
    run = RunConfig.model_validate(
        {"run_id": run_id, "task": task_fields, "grpo": {"group_size": 3, "groups_per_step": 2, "max_new_tokens": 128}}
    )
    bus.redis.set(keys.rollout_key("w-test"), TEST_WORKER_ROLLOUT_KEY)
    service = RewardService(run, RewardSettings(redis_url=redis_server.url, model_dir=ascii_policy_dir), bus)
    thread = threading.Thread(target=service.run_forever, daemon=True)
    thread.start()
    try:
        wait_for(lambda: bus.length(TASKS) >= 1, "the first task", timeout_s=60)
        (delivery,) = bus.read(TASKS, "w-test", count=1, block_ms=100)
        task = delivery.message
        assert task.task_name == name and [m.role for m in task.messages] == ["system", "user"]
        reference = bus.redis.get(keys.task_reference(task.task_id))
        assert reference is not None
        right, wrong = right_and_wrong(name, reference.decode())
        tokenizer = Tokenizer.from_file(str(ascii_policy_dir / "tokenizer.json"))
        rollout = unsigned_rollout_for(task, [right, wrong, ""], tokenizer)
        bus.publish(ROLLOUTS, sign_rollout(rollout, TEST_WORKER_ROLLOUT_KEY))
        scored = wait_for(lambda: bus.read(SCORED, "learner-test", count=1, block_ms=50), "the scored group")
        assert scored[0].message.rewards == [1.0, 0.0, 0.0]
        assert bus.dead_letters() == []
    finally:
        service.stop_event.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and service.scorer.verifiers.pid is None
