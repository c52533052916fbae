"""The task-adapter interface."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
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
