"""`[task] prompt_seed`: another training prompt stream over the same held-out split (make bench-vs-trl's seeds)."""

from __future__ import annotations

from shared.config import TaskConfig
from shared.tasks import build_task


def test_prompt_seed_changes_the_prompt_stream_and_keeps_the_held_out_set() -> None:
    default = build_task(TaskConfig(name="arithmetic_mod10", num_eval_prompts=10, seed=3))
    reseeded = build_task(TaskConfig(name="arithmetic_mod10", num_eval_prompts=10, seed=3, prompt_seed=1))
    again = build_task(TaskConfig(name="arithmetic_mod10", num_eval_prompts=10, seed=3, prompt_seed=1))
    assert reseeded.eval_set == default.eval_set and reseeded.train_set == default.train_set
    stream = [reseeded.sample_prompt() for _ in range(30)]
    assert stream != [default.sample_prompt() for _ in range(30)]
    assert stream == [again.sample_prompt() for _ in range(30)]  # still seeded: reproducible
