"""`math_gym`: seeded arithmetic and algebra problems from reasoning-gym's procedural generators, checked
with math-verify (shared/tasks/math_answers.py).

The universe is `[task] size` problems split evenly between the `[task] reasoning_gym_tasks` generators
(basic_arithmetic, chain_sum, simple_equations by default), each generator seeded with `[task] seed` and
given its options from `[task] reasoning_gym_config` (e.g. the number of terms and digits), so
the learner, the reward service and its verifier child all build the same problems and references.
`[task] answer_format` picks the answer the prompt asks for and the verifier reads: "boxed" (\\boxed{...},
the default) or "number" (the last boxed answer, else the last number: small instruct models rarely box).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Self

from shared.config import TaskConfig
from shared.tasks.base import ChanceBaseline, TaskAdapter, TaskPrompt, majority_answer_baseline
from shared.tasks.chat import PRINTABLE_ASCII, chat_prompt, unique_by_prompt
from shared.tasks.math_answers import (
    boxed_form,
    copy_a_number_baseline,
    math_reward,
    number_form,
    number_reward,
)

MATH_SYSTEM_PROMPT = "Solve the problem. Put your final answer in \\boxed{}."
NUMBER_SYSTEM_PROMPT = "Solve the problem. End your reply with the final answer as a number."


@dataclass(frozen=True)
class AnswerFormat:
    system_prompt: str
    verifier: Callable[[str, str], float]
    in_form: Callable[[str], bool]  # the completion answers in this form (right or wrong)
    guess: str  # a bare number written in this form, for the chance baseline


# [task] answer_format -> how the prompt asks for the answer and how it is read
ANSWER_FORMATS: dict[str, AnswerFormat] = {
    "boxed": AnswerFormat(MATH_SYSTEM_PROMPT, math_reward, boxed_form, "\\boxed{{{}}}"),
    "number": AnswerFormat(NUMBER_SYSTEM_PROMPT, number_reward, number_form, "{}"),
}


class MathGymTask(TaskAdapter):
    name = "math_gym"
    alphabet = PRINTABLE_ASCII
    config_fields = frozenset({"size", "reasoning_gym_tasks", "reasoning_gym_config", "answer_format"})

    def __init__(
        self,
        *,
        num_eval_prompts: int,
        seed: int,
        size: int = 1000,
        datasets: tuple[str, ...] = (),
        dataset_options: Mapping[str, Mapping[str, object]] | None = None,
        answer_format: Literal["boxed", "number"] = "boxed",
    ) -> None:
        self.size = size
        self.datasets = datasets or ("basic_arithmetic", "chain_sum", "simple_equations")
        self.seed = seed
        self.dataset_options = {name: dict(options) for name, options in (dataset_options or {}).items()}
        self.answer_format = ANSWER_FORMATS[answer_format]
        self.system_prompt, self.verifier = self.answer_format.system_prompt, self.answer_format.verifier
        super().__init__(num_eval_prompts=num_eval_prompts, seed=seed)

    @classmethod
    def from_config(cls, config: TaskConfig) -> Self:
        return cls(
            num_eval_prompts=config.num_eval_prompts,
            seed=config.seed,
            size=config.size,
            datasets=tuple(config.reasoning_gym_tasks),
            dataset_options=config.reasoning_gym_config,
            answer_format=config.answer_format,
        )

    def all_prompts(self) -> list[TaskPrompt]:
        prompts = []
        for index, dataset_name in enumerate(self.datasets):
            # the first size % n generators take one more item, so the universe has `size` before dedup
            count = self.size // len(self.datasets) + (1 if index < self.size % len(self.datasets) else 0)
            options = self.dataset_options.get(dataset_name, {})
            for entry in generate(dataset_name, seed=self.seed, size=count, **options):
                prompts.append(chat_prompt(self.system_prompt, str(entry["question"]), str(entry["answer"])))
        return unique_by_prompt(prompts)

    def score(self, completion: str, reference: str) -> float:
        return self.verifier(completion, reference)

    def in_answer_form(self, completion: str) -> bool | None:
        return self.answer_format.in_form(completion)

    def chance_baseline(self) -> ChanceBaseline | None:
        """The better of two format-only strategies: the majority answer, a number copied from the question."""
        baselines = [
            majority_answer_baseline([item.reference for item in self.eval_set]),
            copy_a_number_baseline(self.eval_set, self.score, self.answer_format.guess),
        ]
        return max((b for b in baselines if b is not None), key=lambda baseline: baseline.accuracy)


def generate(dataset_name: str, *, seed: int, size: int, **options: object) -> list[dict[str, object]]:
    """`size` entries of a reasoning-gym dataset (question, answer, metadata), its generator given `options`;
    ValueError for an unknown name or option."""
    if size == 0:
        return []
    import reasoning_gym  # heavy (sympy and more): only where a task is built
    from reasoning_gym.factory import DATASETS

    if dataset_name not in DATASETS:
        raise ValueError(f"reasoning-gym has no dataset {dataset_name!r}; some it has: {sorted(DATASETS)[:20]} ...")
    try:
        dataset = reasoning_gym.create_dataset(dataset_name, seed=seed, size=size, **options)
    except (TypeError, AssertionError) as exc:  # an unknown field; a value its validate() refuses
        raise ValueError(f"reasoning-gym {dataset_name!r} options {options}: {exc}") from exc
    return [dataset[index] for index in range(size)]
