"""Scored groups sampled from the learner's own model: what a rollout worker plus the reward service
would produce for the same prompts, with true behaviour log-probs and the task's verifier rewards.

This lets the learner's half of the system run alone in tests: the single-process learning check trains
on these directly, and the stand-in workers of the learner tests put them on the `scored` stream.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import torch

from engines.interface import Sampling
from shared.messages import RolloutGroup, ScoredGroup, pack_float32, pack_int32
from shared.tasks import TaskAdapter, TaskPrompt
from tests.sampling import generate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def sample_scored_groups(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    task: TaskAdapter,
    prompts: list[TaskPrompt],
    *,
    run_id: str,
    policy_version: int,
    sampling: Sampling,
    worker_id: str = "selfplay",
    generator: torch.Generator | None = None,
) -> list[ScoredGroup]:
    """One GRPO group of `sampling.num_samples` samples per prompt, sampled by `model` (as `policy_version`)."""
    prompt_ids = [tokenizer(item.prompt, add_special_tokens=False)["input_ids"] for item in prompts]
    samples = generate(model, prompt_ids, sampling, eos_token_ids={tokenizer.eos_token_id}, generator=generator)
    groups = []
    for item, ids, completions in zip(prompts, prompt_ids, samples, strict=True):
        texts = [completion.text(tokenizer) for completion in completions]
        rollout = RolloutGroup(
            run_id=run_id,
            group_id=uuid.uuid4().hex,
            task_id=uuid.uuid4().hex,
            task_name=task.name,
            prompt=item.prompt,
            worker_id=worker_id,
            policy_version=policy_version,
            temperature=sampling.temperature,
            prompt_token_ids=pack_int32(ids),
            completion_token_ids=pack_int32([t for c in completions for t in c.token_ids]),
            completion_lengths=pack_int32([len(c.token_ids) for c in completions]),
            behaviour_logprobs=pack_float32([lp for c in completions for lp in c.logprobs]),
            completion_texts=texts,
            finish_reasons=["stop" if c.stopped else "length" for c in completions],
            generation_s=0.0,
        )
        rewards = [task.score(text, item.reference) for text in texts]
        groups.append(ScoredGroup(run_id=run_id, rollout=rollout, rewards=rewards))
    return groups
