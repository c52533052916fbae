"""`math_gym`: seeded arithmetic and algebra problems from reasoning-gym's procedural generators, checked
with math-verify (shared/tasks/math_answers.py).

The universe is `[task] size` problems split evenly between the `[task] reasoning_gym_tasks` generators
(basic_arithmetic, chain_sum, simple_equations by default), each generator seeded with `[task] seed`, so
the learner, the reward service and its verifier child all build the same problems and references.
"""

from __future__ import annotations

from typing import Self

from shared.config import TaskConfig
from shared.tasks.base import TaskAdapter, TaskPrompt
from shared.tasks.chat import PRINTABLE_ASCII, chat_prompt, unique_by_prompt
from shared.tasks.math_answers import math_reward

MATH_SYSTEM_PROMPT = "Solve the problem. Put your final answer in \\boxed{}."


class MathGymTask(TaskAdapter):
    name = "math_gym"
    alphabet = PRINTABLE_ASCII
    config_fields = frozenset({"size", "reasoning_gym_tasks"})

    def __init__(self, *, num_eval_prompts: int, seed: int, size: int = 1000, datasets: tuple[str, ...] = ()) -> None:
        self.size = size
        self.datasets = datasets or ("basic_arithmetic", "chain_sum", "simple_equations")
        self.seed = seed
        super().__init__(num_eval_prompts=num_eval_prompts, seed=seed)

    @classmethod
    def from_config(cls, config: TaskConfig) -> Self:
        return cls(
            num_eval_prompts=config.num_eval_prompts,
            seed=config.seed,
            size=config.size,
            datasets=tuple(config.reasoning_gym_tasks),
        )

    def all_prompts(self) -> list[TaskPrompt]:
        prompts = []
        for index, dataset_name in enumerate(self.datasets):
            # the first size % n generators take one more item, so the universe has `size` before dedup
            count = self.size // len(self.datasets) + (1 if index < self.size % len(self.datasets) else 0)
            for entry in generate(dataset_name, seed=self.seed, size=count):
                prompts.append(chat_prompt(MATH_SYSTEM_PROMPT, str(entry["question"]), str(entry["answer"])))
        return unique_by_prompt(prompts)

    def score(self, completion: str, reference: str) -> float:
        return math_reward(completion, reference)


def generate(dataset_name: str, *, seed: int, size: int) -> list[dict[str, object]]:
    """`size` entries of a reasoning-gym dataset (question, answer, metadata); ValueError for an unknown name."""
    if size == 0:
        return []
    import reasoning_gym  # heavy (sympy and more): only where a task is built
    from reasoning_gym.factory import DATASETS

    if dataset_name not in DATASETS:
        raise ValueError(f"reasoning-gym has no dataset {dataset_name!r}; some it has: {sorted(DATASETS)[:20]} ...")
    dataset = reasoning_gym.create_dataset(dataset_name, seed=seed, size=size)
    return [dataset[index] for index in range(size)]
