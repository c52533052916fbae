"""Held-out evaluation: greedy accuracy on the task's eval set (prompts never sampled for training)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from services.learner.decode import generate
from shared.tasks import TaskAdapter
from shared.tokenization import encode_prompt

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
    eos_token_ids: Collection[int],
) -> EvalResult:
    """Decode every held-out prompt greedily and score it with the task's verifier.

    Prompts are encoded and completions stopped exactly as the workers do (shared.tokenization), so
    the accuracy measures the policy training sees."""
    prompts = [encode_prompt(tokenizer, item.input) for item in task.eval_set]
    completions = generate(
        model,
        prompts,
        num_samples=1,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        eos_token_ids=eos_token_ids,
        greedy=True,
    )
    rewards = []
    for item, (completion,) in zip(task.eval_set, completions, strict=True):
        rewards.append(task.score(completion.text(tokenizer), item.reference))
    num_correct = sum(1 for reward in rewards if reward == 1.0)
    return EvalResult(num_correct / len(rewards), sum(rewards) / len(rewards), len(rewards))
