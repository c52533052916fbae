"""The math tasks (shared/tasks/math_gym.py, math_file.py): math-verify on right, wrong and equivalent
answers, seeded universes, local files without a hub, and clear errors."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from shared.config import TaskConfig
from shared.tasks import build_task, make_task
from shared.tasks.math_answers import MAX_COMPLETION_CHARS, last_boxed, last_number, math_reward, number_reward


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        ("so the answer is \\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\frac12}", "1/2"),
        ("x = \\boxed{13}", "13"),
        ("\\boxed{x = 13}", "13"),
        ("\\boxed{13}", "x = 13"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("first \\boxed{3}, corrected: \\boxed{-4}", "-4"),  # the last boxed answer counts
        ("\\boxed{-4}", "$-4$"),
    ],
)
def test_right_answers_score_one_in_any_equivalent_form(completion: str, reference: str) -> None:
    assert math_reward(completion, reference) == 1.0


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        ("\\boxed{3}", "-4"),
        ("\\boxed{0.51}", "\\frac{1}{2}"),
        ("the answer is 13", "13"),  # not boxed: unparsable as an answer
        ("\\boxed{}", "1"),
        ("\\boxed{{{{", "1"),
        ("\\boxed{-4}, no wait \\boxed{3}", "-4"),
        ("", "2"),
        ("\\boxed{2}" + " " * MAX_COMPLETION_CHARS, "2"),  # only the tail is searched
    ],
)
def test_wrong_or_unparsable_answers_score_zero(completion: str, reference: str) -> None:
    assert math_reward(completion, reference) == 0.0


def test_last_boxed_matches_nested_braces_and_skips_an_unclosed_one() -> None:
    assert last_boxed("\\boxed{\\frac{1}{2}} text") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} then \\boxed{2") == "1"
    assert last_boxed("none") is None


def test_math_gym_universe_is_the_same_for_a_seed_with_a_disjoint_held_out_set() -> None:
    config = TaskConfig(name="math_gym", num_eval_prompts=10, seed=7, size=90)
    first, again, other = build_task(config), build_task(config), build_task(config.model_copy(update={"seed": 8}))
    assert [(p.prompt, p.reference) for p in first.eval_set + first.train_set] == [
        (p.prompt, p.reference) for p in again.eval_set + again.train_set
    ]
    assert [p.prompt for p in first.eval_set] != [p.prompt for p in other.eval_set]
    assert not {p.prompt for p in first.eval_set} & {p.prompt for p in first.train_set}
    assert 80 <= len(first.eval_set) + len(first.train_set) <= 90  # duplicates removed
    for prompt in first.eval_set + first.train_set:
        assert [m.role for m in prompt.messages] == ["system", "user"] and "\\boxed{}" in prompt.messages[0].content
        assert set(prompt.prompt + prompt.reference) <= set(first.alphabet)  # the tiny tokenizer covers it
    for prompt in first.eval_set:  # every generated answer parses: its boxed form scores 1, another 0
        assert first.score(f"\\boxed{{{prompt.reference}}}", prompt.reference) == 1.0
        assert first.score("\\boxed{123456789}", prompt.reference) == 0.0


@pytest.mark.parametrize(
    ("completion", "reference", "reward"),
    [
        ("5 - 3 - 6 = -4", "-4", 1.0),
        ("The answer is 15.", "15", 1.0),  # a sentence's full stop is not a decimal point
        ("57 + 87 = 144, then 144 + 70 = 214", "214", 1.0),  # the last number counts
        ("It is 1,234.", "1234", 1.0),
        ("So m = 62", "62", 1.0),
        ("2-1 gives 1", "1", 1.0),
        ("first \\boxed{-4}, and 7 is not it", "-4", 1.0),  # a boxed answer wins over a later number
        ("The answer is 15", "5", 0.0),  # what arithmetic_mod10 would want, and no partial match
        ("5-3", "-3", 0.0),  # a minus between operands is not a sign
        ("no number here", "3", 0.0),
        ("3" + " " * MAX_COMPLETION_CHARS, "3", 0.0),  # only the tail is searched
    ],
)
def test_number_answers_are_the_last_boxed_answer_else_the_last_number(
    completion: str, reference: str, reward: float
) -> None:
    assert number_reward(completion, reference) == reward


def test_last_number_reads_signs_commas_and_decimals() -> None:
    assert last_number("x is -12.5, y is 1,000") == "1000"
    assert last_number("a-7") == "7"  # a minus after a word is an operator
    assert last_number("nothing") is None


def test_math_gym_number_format_asks_for_a_number_and_scores_an_unboxed_answer() -> None:
    config = TaskConfig(
        name="math_gym", num_eval_prompts=5, size=40, reasoning_gym_tasks=["chain_sum"], answer_format="number"
    )
    task = build_task(config)
    for prompt in task.eval_set:
        assert "as a number" in prompt.messages[0].content and "boxed" not in prompt.messages[0].content
        assert task.score(f"Adding up, I get {prompt.reference}.", prompt.reference) == 1.0
        assert task.score(f"\\boxed{{{prompt.reference}}}", prompt.reference) == 1.0
        assert task.score("I get 123456789.", prompt.reference) == 0.0
    # the default stays boxed-only
    boxed = build_task(config.model_copy(update={"answer_format": "boxed"}))
    assert boxed.score(f"I get {boxed.eval_set[0].reference}.", boxed.eval_set[0].reference) == 0.0


def test_math_gym_refuses_an_unknown_generator_and_a_bad_name() -> None:
    with pytest.raises(ValueError, match="reasoning-gym has no dataset 'no_such_gym'"):
        build_task(TaskConfig(name="math_gym", size=10, num_eval_prompts=1, reasoning_gym_tasks=["no_such_gym"]))
    with pytest.raises(ValueError, match="not a reasoning-gym dataset name"):
        TaskConfig(name="math_gym", reasoning_gym_tasks=["../etc"])


def rows() -> list[dict[str, str]]:
    return [
        {"problem": "What is 1/2 as a decimal?", "solution": "0.5", "extra": "x"},
        {"problem": "Solve 2x = 6.", "solution": "x = 3", "extra": "y"},
        {"problem": "What is 3 + 4?", "solution": "7", "extra": "z"},
        {"problem": "What is 3 + 4?", "solution": "7", "extra": "again"},  # a duplicate: kept once
        {"problem": "Half of one?", "solution": "\\frac{1}{2}", "extra": "w"},
    ]


def file_config(path: Path, **fields: object) -> TaskConfig:
    return TaskConfig(
        name="math_file", path=path, question_column="problem", answer_column="solution", num_eval_prompts=1, **fields
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_math_file_reads_a_local_jsonl_or_parquet_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"problems{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    else:
        import pyarrow as pa  # here, not at the top: the vLLM environment collects this file without the extra
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows()), path)
    task = build_task(file_config(path))
    prompts = {p.messages[1].content: p.reference for p in task.eval_set + task.train_set}
    assert prompts == {row["problem"]: row["solution"] for row in rows()}
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"  # never the hub
    references = {p.messages[1].content: p for p in task.eval_set + task.train_set}
    half = references["Half of one?"]
    assert task.score("it is \\boxed{0.5}", half.reference) == 1.0
    assert task.score("\\boxed{3}", references["Solve 2x = 6."].reference) == 1.0
    assert task.score("\\boxed{6}", references["Solve 2x = 6."].reference) == 0.0


def test_math_file_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs path"):
        build_task(TaskConfig(name="math_file"))
    with pytest.raises(ValueError, match="does not exist"):
        build_task(file_config(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="expected a .jsonl / .json / .parquet file"):
        build_task(file_config(tmp_path / "problems.csv"))
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    with pytest.raises(
        ValueError, match=r"has no column \['solutions'\]; its columns: \['problem', 'solution', 'extra'\]"
    ):
        build_task(file_config(path).model_copy(update={"answer_column": "solutions"}))
    path.write_text(json.dumps({"problem": "What is 1 + 1?", "solution": ""}) + "\n" + json.dumps(rows()[0]) + "\n")
    with pytest.raises(ValueError, match="row 0 has an empty"):
        build_task(file_config(path))


def test_fields_another_task_reads_are_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shared.tasks"):
        task = build_task(TaskConfig(name="arithmetic_mod10", size=50, path=tmp_path / "x.jsonl"))
    assert task.name == "arithmetic_mod10"
    assert "['path', 'size'] ignored: task arithmetic_mod10 does not read them" in caplog.text
    assert len(make_task("arithmetic_mod10", num_eval_prompts=20, seed=0).train_set) == 80  # as before


def test_math_gym_passes_generator_options_and_refuses_unknown_ones() -> None:
    two_terms = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    task = build_task(
        TaskConfig(
            name="math_gym",
            num_eval_prompts=5,
            size=60,
            reasoning_gym_tasks=["chain_sum"],
            reasoning_gym_config=two_terms,
            answer_format="number",
        )
    )
    for item in task.train_set + task.eval_set:
        problem = item.messages[-1].content.rsplit(":", 1)[-1]
        operands = [token for token in problem.replace("=", " ").split() if token.lstrip("-").isdigit()]
        assert len(operands) == 2 and all(len(o.lstrip("-")) == 1 for o in operands), problem

    with pytest.raises(ValueError, match="bogus"):
        build_task(
            TaskConfig(
                name="math_gym",
                num_eval_prompts=5,
                size=60,
                reasoning_gym_tasks=["chain_sum"],
                reasoning_gym_config={"chain_sum": {"bogus": 1}},
            )
        )
    with pytest.raises(ValueError, match="does not list"):
        TaskConfig(name="math_gym", reasoning_gym_tasks=["chain_sum"], reasoning_gym_config={"basic_arithmetic": {}})
