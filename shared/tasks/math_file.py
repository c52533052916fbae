"""`math_file`: math problems from a local file the user brings, checked with math-verify.

`[task] path` is a JSONL (or JSON) or Parquet file with a question and an answer column (`[task]
question_column`, `answer_column`), read with the `datasets` library from the local file only: the hub is
switched off (HF_DATASETS_OFFLINE, HF_HUB_OFFLINE) before `datasets` is imported, and its cache lives in a
temporary folder removed after reading. Every row is a prompt (duplicate questions once); answers are
LaTeX or plain ("\\frac{1}{2}", "0.5", "x = 13"). The file must exist wherever the learner and the reward
service run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Self

from shared.config import TaskConfig
from shared.tasks.base import TaskAdapter, TaskPrompt
from shared.tasks.chat import PRINTABLE_ASCII, chat_prompt, unique_by_prompt
from shared.tasks.math_answers import boxed_form, math_reward
from shared.tasks.math_gym import MATH_SYSTEM_PROMPT

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class MathFileTask(TaskAdapter):
    name = "math_file"
    alphabet = PRINTABLE_ASCII  # the tiny demo tokenizer; a file with other characters needs a real one
    config_fields = frozenset({"path", "question_column", "answer_column"})

    def __init__(
        self, *, num_eval_prompts: int, seed: int, path: Path, question_column: str, answer_column: str
    ) -> None:
        self.path = path
        self.question_column = question_column
        self.answer_column = answer_column
        super().__init__(num_eval_prompts=num_eval_prompts, seed=seed)

    @classmethod
    def from_config(cls, config: TaskConfig) -> Self:
        if config.path is None:
            raise ValueError("[task] name = 'math_file' needs path = a local .jsonl or .parquet file")
        return cls(
            num_eval_prompts=config.num_eval_prompts,
            seed=config.seed,
            path=config.path,
            question_column=config.question_column,
            answer_column=config.answer_column,
        )

    def all_prompts(self) -> list[TaskPrompt]:
        questions, answers = read_columns(self.path, self.question_column, self.answer_column)
        prompts = []
        for row, (question, answer) in enumerate(zip(questions, answers, strict=True)):
            if question is None or answer is None or not str(question).strip() or not str(answer).strip():
                raise ValueError(
                    f"{self.path}: row {row} has an empty {self.question_column!r} or {self.answer_column!r}"
                )
            prompts.append(chat_prompt(MATH_SYSTEM_PROMPT, str(question), str(answer)))
        return unique_by_prompt(prompts)

    def score(self, completion: str, reference: str) -> float:
        return math_reward(completion, reference)

    def in_answer_form(self, completion: str) -> bool | None:
        return boxed_form(completion)


def read_columns(path: Path, question_column: str, answer_column: str) -> tuple[list[object], list[object]]:
    """The two columns of a local JSONL/JSON/Parquet file; ValueError for a missing file, an unknown
    format or a missing column (naming the columns the file has)."""
    file_format = FILE_FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise ValueError(f"[task] path {path}: expected a {' / '.join(FILE_FORMATS)} file")
    if not path.is_file():
        raise ValueError(
            f"[task] path {path} does not exist (it must be on every machine running the learner or the reward service)"
        )
    # Never the hub: these are read when `datasets` (and huggingface_hub) are first imported.
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets

    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True  # imported earlier elsewhere
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="math_file_cache_") as cache_dir:
        table = datasets.load_dataset(file_format, data_files=str(path), split="train", cache_dir=cache_dir)
        assert isinstance(table, datasets.Dataset)
        missing = [column for column in (question_column, answer_column) if column not in table.column_names]
        if missing:
            raise ValueError(f"[task] path {path} has no column {missing}; its columns: {table.column_names}")
        return list(table[question_column]), list(table[answer_column])
