"""Logic puzzles from reasoning-gym, scored by reasoning-gym's own scorers.

- `knights_knaves`: islanders who always tell the truth or always lie; say who is which. The scorer gives
  1.0 for the exact assignment and partial credit (0.3 + 0.7 x the share right) when every name is there.
- `mini_sudoku`: a 4x4 Sudoku with 8-12 empty cells and a unique solution. Picked as the second puzzle
  because it is small (a 4-line answer of digits), has one right answer that is cheap to check, and its
  scorer gives credit per correct cell, a denser signal than all-or-nothing for a model starting out.

The model answers inside <answer></answer> (the last pair counts; no tags: reward 0). The scorers need
the generated entry (its metadata holds the solution), so the reference is the entry serialized as JSON
and rebuilt in `score`. Both are seeded by `[task] seed` and sized by `[task] size`, so every process
builds the same puzzles.
"""

from __future__ import annotations

import json
from typing import Any, Self

from shared.config import TaskConfig
from shared.tasks.base import ChanceBaseline, TaskAdapter, TaskPrompt
from shared.tasks.chat import PRINTABLE_ASCII, chat_prompt, unique_by_prompt
from shared.tasks.math_gym import generate

LOGIC_SYSTEM_PROMPT = (
    "Solve the puzzle. Think it through, then give only your final answer inside <answer></answer>, "
    "in the format the puzzle asks for."
)
MAX_COMPLETION_CHARS = 4000  # the answer comes last; a long ramble costs the scorer nothing more


class ReasoningGymPuzzleTask(TaskAdapter):
    """A reasoning-gym dataset as a task: its generator for the universe, its `score_answer` for the reward."""

    dataset_name: str
    alphabet = PRINTABLE_ASCII
    config_fields = frozenset({"size"})

    def __init__(self, *, num_eval_prompts: int, seed: int, size: int = 1000) -> None:
        self.size = size
        self.seed = seed
        self._scorer: Any = None  # the dataset object whose score_answer is the verifier (built lazily)
        super().__init__(num_eval_prompts=num_eval_prompts, seed=seed)

    @classmethod
    def from_config(cls, config: TaskConfig) -> Self:
        return cls(num_eval_prompts=config.num_eval_prompts, seed=config.seed, size=config.size)

    def all_prompts(self) -> list[TaskPrompt]:
        prompts = []
        for entry in generate(self.dataset_name, seed=self.seed, size=self.size):
            reference = json.dumps(
                {"question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]}
            )
            prompts.append(chat_prompt(LOGIC_SYSTEM_PROMPT, str(entry["question"]), reference))
        return unique_by_prompt(prompts)

    def score(self, completion: str, reference: str) -> float:
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(completion[-MAX_COMPLETION_CHARS:])
        if answer is None:
            return 0.0
        if self._scorer is None:
            import reasoning_gym

            self._scorer = reasoning_gym.create_dataset(self.dataset_name, seed=self.seed, size=1)
        reward = float(self._scorer.score_answer(answer, json.loads(reference)))
        return min(1.0, max(0.0, reward))

    def in_answer_form(self, completion: str) -> bool | None:
        """An answer inside <answer></answer> (the scorer reads nothing else)."""
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(completion[-MAX_COMPLETION_CHARS:])
        return answer is not None and bool(answer.strip())

    def chance_baseline(self) -> ChanceBaseline | None:
        """None: every puzzle has its own answer (a majority answer scores nothing)."""
        return None


class KnightsKnavesTask(ReasoningGymPuzzleTask):
    name = "knights_knaves"
    dataset_name = "knights_knaves"


class MiniSudokuTask(ReasoningGymPuzzleTask):
    name = "mini_sudoku"
    dataset_name = "mini_sudoku"
