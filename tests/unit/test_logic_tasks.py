"""The logic tasks (shared/tasks/logic.py): reasoning-gym's Knights and Knaves and 4x4 Sudoku, scored by
reasoning-gym's own scorers through the entry carried in the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.config import TaskConfig
from shared.tasks import build_task


def answer(text: str) -> str:
    return f"Let me think.\n<answer>{text}</answer>"


def test_knights_and_knaves_right_partial_and_wrong_answers() -> None:
    task = build_task(TaskConfig(name="knights_knaves", num_eval_prompts=5, size=40, seed=1))
    prompt = task.eval_set[0]
    entry = json.loads(prompt.reference)
    solution = entry["answer"]  # e.g. "Amelia is a knight, and Elizabeth is a knave."
    assert prompt.messages[1].content == entry["question"] and "<answer>" in prompt.messages[0].content
    assert task.score(answer(solution), prompt.reference) == 1.0
    metadata = entry["metadata"]
    terms = metadata["knight_knave_terms"]  # the puzzle's words: knight/knave, altruist/egoist, ...

    def assignment(truthful: list[bool]) -> str:
        said = [
            f"{name} is {terms['a_knight'] if t else terms['a_knave']}"
            for name, t in zip(metadata["names"], truthful, strict=True)
        ]
        return ", and ".join(said) + "."

    truth = list(metadata["solution"])
    assert task.score(answer(assignment(truth)), prompt.reference) == 1.0  # rebuilt from the metadata
    assert task.score(answer(assignment([not t for t in truth])), prompt.reference) == 0.0
    one_wrong = [not truth[0], *truth[1:]]
    expected = 0.3 + 0.7 * (len(truth) - 1) / len(truth)  # reasoning-gym's partial credit
    assert task.score(answer(assignment(one_wrong)), prompt.reference) == pytest.approx(expected)
    assert task.score(solution, prompt.reference) == 0.0  # no <answer> tags
    assert task.score(answer("no idea"), prompt.reference) == 0.0


def test_mini_sudoku_scores_the_solution_one_and_credits_cells() -> None:
    task = build_task(TaskConfig(name="mini_sudoku", num_eval_prompts=5, size=40, seed=1))
    prompt = task.eval_set[0]
    solution = json.loads(prompt.reference)["answer"]  # "1 2 3 4\n3 4 1 2\n..."
    assert task.score(answer(solution), prompt.reference) == 1.0
    first = solution[0]
    wrong_cell = ("2" if first != "2" else "3") + solution[1:]
    assert 0.5 < task.score(answer(wrong_cell), prompt.reference) < 1.0  # credit for the 15 right cells
    assert task.score(answer("1 1 1 1"), prompt.reference) < 0.5
    assert task.score("", prompt.reference) == 0.0


@pytest.mark.parametrize("name", ["knights_knaves", "mini_sudoku"])
def test_a_seed_gives_the_same_puzzles_and_a_disjoint_held_out_set(name: str) -> None:
    config = TaskConfig(name=name, num_eval_prompts=8, size=60, seed=5)
    first, again = build_task(config), build_task(config)
    other = build_task(config.model_copy(update={"seed": 6}))
    assert [(p.prompt, p.reference) for p in first.eval_set + first.train_set] == [
        (p.prompt, p.reference) for p in again.eval_set + again.train_set
    ]
    assert [p.prompt for p in first.eval_set] != [p.prompt for p in other.eval_set]
    assert not {p.prompt for p in first.eval_set} & {p.prompt for p in first.train_set}
    for prompt in first.eval_set + first.train_set:
        assert set(prompt.prompt) <= set(first.alphabet)  # the tiny tokenizer covers every prompt
        assert first.score(answer(json.loads(prompt.reference)["answer"]), prompt.reference) == 1.0


def test_the_tiny_tokenizer_keeps_every_space_and_newline_of_a_puzzle_prompt(tmp_path: Path) -> None:
    """Regression: AutoTokenizer rebuilds a qwen2 folder's tokenizer with Qwen's byte-level class, which
    dropped the spaces and newlines of a plain character vocabulary (services/learner/model_init.py)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tokenization import encode_prompt

    task = build_task(TaskConfig(name="mini_sudoku", num_eval_prompts=2, size=10))
    model_dir = build_initial_policy(
        ModelConfig(init="tiny-random", max_position_embeddings=1024), task.alphabet, tmp_path
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))  # what the reward service decodes with
    prompt = task.eval_set[0]
    ids = encode_prompt(tokenizer, prompt.input)  # raises if the text does not survive the round trip
    assert raw.decode(ids, skip_special_tokens=True) == prompt.prompt
    assert len(ids) == len(prompt.prompt)  # one token per character
