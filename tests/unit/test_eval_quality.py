"""What an evaluation learned: the answer form apart from the skill, and the chance baseline
(shared/tasks, services/learner/evaluate.py summarize_eval)."""

from __future__ import annotations

import pytest

from services.learner.evaluate import summarize_eval
from shared.tasks.arithmetic import ArithmeticMod10Task
from shared.tasks.base import TaskPrompt, majority_answer_baseline
from shared.tasks.chat import chat_prompt
from shared.tasks.math_answers import copy_a_number_baseline, number_form, number_reward, question_numbers
from shared.tasks.math_gym import MathGymTask


def test_summary_splits_format_from_accuracy() -> None:
    task = ArithmeticMod10Task(num_eval_prompts=20, seed=0)
    # two answers in form (a digit), one right; one out of form ("12" is two characters)
    result = summarize_eval(task, ["3", "4", "12"], [1.0, 0.0, 0.0])
    assert result.accuracy == pytest.approx(1 / 3)
    assert result.format_rate == pytest.approx(2 / 3)
    assert result.formatted_accuracy == pytest.approx(1 / 2)
    record = result.record(task, eval_step=4, eval_s=1.0, eval_stall_s=0.0, wall_s=2.0, evaluated_by="workers")
    assert record.eval_chance_accuracy is not None and record.eval_chance_strategy == "the majority answer, always"
    assert record.evaluated_by == "workers"


def test_summary_without_answers_in_form_has_no_formatted_accuracy() -> None:
    task = ArithmeticMod10Task(num_eval_prompts=20, seed=0)
    result = summarize_eval(task, ["", "ab"], [0.0, 0.0])
    assert result.format_rate == 0.0 and result.formatted_accuracy is None
    with pytest.raises(ValueError):
        summarize_eval(task, ["1"], [])


def test_majority_baseline() -> None:
    baseline = majority_answer_baseline(["1", "2", "1", "3"])
    assert baseline is not None and baseline.accuracy == 0.5
    assert majority_answer_baseline([]) is None


def test_number_form_is_a_reply_ending_in_a_number() -> None:
    assert number_form("so the answer is 1,234.5.")
    assert number_form("\\boxed{7} is it")
    assert not number_form("42 apples")
    assert not number_form("I do not know")


def test_copying_a_number_from_the_question_scores_by_the_verifier() -> None:
    assert question_numbers("largest of 1,200.5 and 3e2 and 1,200.5?") == ["1200.5", "3e2"]
    items = [
        chat_prompt("sys", "pick the largest: 3 7", "7"),  # one of two candidates right: 1/2
        chat_prompt("sys", "what is 2 + 2", "4"),  # the answer is not in the question: 0
        TaskPrompt("no numbers here", "5"),  # no candidate: 0
    ]
    baseline = copy_a_number_baseline(items, number_reward, "{}")
    assert baseline.accuracy == pytest.approx((0.5 + 0 + 0) / 3)


def test_math_gym_chance_baseline_is_the_better_strategy() -> None:
    task = MathGymTask(num_eval_prompts=40, seed=0, size=200, datasets=("number_format",), answer_format="number")
    baseline = task.chance_baseline()
    # a number_format question lists its candidates: copying one scores well above the majority answer
    assert baseline is not None and baseline.strategy == "a random number from the question"
    assert 0.1 < baseline.accuracy < 0.6
    assert task.in_answer_form("574967251.308") and not task.in_answer_form("the largest one")
