"""The task-adapter interface."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Self

from shared.config import TaskConfig
from shared.messages import ChatMessage
from shared.tokenization import PromptInput


@dataclass(frozen=True)
class TaskPrompt:
    prompt: str  # the raw text; with `messages`, their plain form (logs, tokenizers without a chat template)
    reference: str  # what the verifier compares against; never sent to workers
    # Chat tasks: the turns to render with the tokenizer's chat template (shared.tokenization.encode_prompt).
    # Empty: the prompt is raw text (the demo tasks).
    messages: tuple[ChatMessage, ...] = ()

    @property
    def input(self) -> PromptInput:
        """What the tokenizer encodes (workers and the learner's evaluation alike)."""
        return PromptInput(self.prompt, self.messages)


class TaskAdapter(ABC):
    """Prompts to train on, a disjoint held-out set, and a verifier giving a reward in [0, 1]."""

    name: str
    alphabet: str  # every character a prompt or a correct answer can contain (the tokenizer covers it)
    # [task] fields of the run file the adapter reads besides name, num_eval_prompts and seed (from_config)
    config_fields: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: TaskConfig) -> Self:
        """The adapter the run file's [task] section describes; adapters with `config_fields` override it."""
        return cls(num_eval_prompts=config.num_eval_prompts, seed=config.seed)

    def __init__(self, *, num_eval_prompts: int, seed: int) -> None:
        universe = self.all_prompts()
        if num_eval_prompts >= len(universe):
            raise ValueError(
                f"{self.name}: {num_eval_prompts} held-out prompts leave none of {len(universe)} to train on"
            )
        shuffled = random.Random(seed).sample(universe, len(universe))
        self.eval_set: list[TaskPrompt] = shuffled[:num_eval_prompts]
        self.train_set: list[TaskPrompt] = shuffled[num_eval_prompts:]
        self._rng = random.Random(seed + 1)

    @abstractmethod
    def all_prompts(self) -> list[TaskPrompt]:
        """Every prompt of the task (small finite tasks) before the held-out split."""

    @abstractmethod
    def score(self, completion: str, reference: str) -> float:
        """Reward of one completion (text after the prompt, EOS stripped) in [0, 1]."""

    def reseed_prompt_stream(self, seed: int) -> None:
        """Restart the training prompt stream from `seed` (`[task] prompt_seed`); the universe and the
        held-out split keep the seed they were built with."""
        self._rng = random.Random(seed)

    def sample_prompt(self) -> TaskPrompt:
        """A training prompt (never one of the held-out set)."""
        return self._rng.choice(self.train_set)

    # What an evaluation learned (docs/evaluation.md): format apart from skill
    def in_answer_form(self, completion: str) -> bool | None:
        """Is `completion` an answer in the form the task asks for (right or wrong)? None: the task has no
        form apart from its reward (an environment's episodes). Default: the completion, stripped, is all
        characters of the task's alphabet and as long as the references (the toy tasks' "a digit")."""
        answer = completion.strip()
        lengths = {len(item.reference) for item in self.eval_set}
        return bool(answer) and len(answer) in lengths and all(char in self.alphabet for char in answer)

    def chance_baseline(self) -> ChanceBaseline | None:
        """The held-out accuracy that the answer form alone earns, without the skill (None: the task defines
        none). Default: the majority answer, always given (the share of held-out references equal to the
        most common one)."""
        return majority_answer_baseline([item.reference for item in self.eval_set])


@dataclass(frozen=True)
class ChanceBaseline:
    accuracy: float  # expected held-out accuracy of the strategy
    strategy: str  # what it does, for the report ("majority answer", "a random number from the question")


def majority_answer_baseline(references: list[str]) -> ChanceBaseline | None:
    if not references:
        return None
    ((_, count),) = Counter(references).most_common(1)
    return ChanceBaseline(count / len(references), "the majority answer, always")
