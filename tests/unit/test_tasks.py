import pytest

from shared.tasks import TASKS, make_task


def test_held_out_prompts_are_never_sampled_for_training() -> None:
    task = make_task("arithmetic_mod10", num_eval_prompts=20, seed=0)
    held_out = {p.prompt for p in task.eval_set}
    sampled = {task.sample_prompt().prompt for _ in range(2000)}
    assert len(held_out) == 20
    assert sampled.isdisjoint(held_out)
    assert len(sampled) == 80  # every training prompt shows up


def test_the_answer_depends_on_the_prompt() -> None:
    task = make_task("arithmetic_mod10", num_eval_prompts=20, seed=0)
    by_prompt = {p.prompt: p.reference for p in task.train_set + task.eval_set}
    assert by_prompt["7+8="] == "5"
    assert by_prompt["0+0="] == "0"
    assert len(set(by_prompt.values())) == 10


def test_arithmetic_verifier_gives_partial_credit_only_for_the_right_digit() -> None:
    task = TASKS["arithmetic_mod10"](num_eval_prompts=1, seed=0)
    assert task.score("5", "5") == 1.0
    assert task.score("55", "5") == 0.5
    assert task.score("4", "5") == 0.0
    assert task.score("", "5") == 0.0


def test_reverse_verifier_counts_digits_in_place() -> None:
    task = TASKS["reverse_digits"](num_eval_prompts=10, seed=0)
    assert task.score("321", "321") == 1.0
    assert task.score("391", "321") == pytest.approx(2 / 3)
    assert task.score("32", "321") == pytest.approx(2 / 3 - 0.25)


def test_unknown_task_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="arithmetic_mod10"):
        make_task("chess", num_eval_prompts=1, seed=0)


def test_a_held_out_set_as_large_as_the_task_is_refused() -> None:
    with pytest.raises(ValueError, match="leave none"):
        make_task("arithmetic_mod10", num_eval_prompts=100, seed=0)
