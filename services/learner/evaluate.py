"""Held-out evaluation: greedy accuracy on the task's eval set (prompts never sampled for training)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from services.learner.decode import generate
from shared.tasks import TaskAdapter

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # fraction of held-out prompts whose greedy completion scores exactly 1.0
    reward_mean: float  # mean verifier reward (partial credit included)
    num_prompts: int


def evaluate_greedy(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    task: TaskAdapter,
    *,
    max_new_tokens: int,
    eos_token_id: int,
) -> EvalResult:
    """Decode every held-out prompt greedily and score it with the task's verifier."""
    prompts = [tokenizer(item.prompt, add_special_tokens=False)["input_ids"] for item in task.eval_set]
    completions = generate(
        model,
        prompts,
        num_samples=1,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        eos_token_id=eos_token_id,
        greedy=True,
    )
    rewards = []
    for item, (completion,) in zip(task.eval_set, completions, strict=True):
        rewards.append(task.score(completion.text(tokenizer), item.reference))
    num_correct = sum(1 for reward in rewards if reward == 1.0)
    return EvalResult(num_correct / len(rewards), sum(rewards) / len(rewards), len(rewards))
