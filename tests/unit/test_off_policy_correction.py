"""`[grpo] off_policy_correction`: "none" trains stale samples as if on-policy (every importance weight
1), the staleness ablation's control; "truncated_is" weighs them by min(pi_prox / mu, cap)."""

from __future__ import annotations

import dataclasses

import torch

from services.learner.trainer import train_step
from shared.config import GRPOConfig
from tests.unit.test_learner_step_layout import random_batch, tiny_qwen2


def step_update(correction: str, behaviour_from_model: bool) -> dict[str, torch.Tensor]:
    """Parameter change of one train_step with plain SGD (the update is lr * gradient, easy to compare)."""
    model = tiny_qwen2(tied=True)
    batch = random_batch()
    if behaviour_from_model:  # an on-policy batch: mu is the model's own log-probs
        from services.learner.grpo import token_logprobs

        with torch.no_grad():
            own = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures)
        batch = dataclasses.replace(batch, behaviour_logprobs=own * batch.completion_mask)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grpo = GRPOConfig(off_policy_correction=correction, max_grad_norm=1e9)
    train_step(model, optimizer, batch, grpo)
    return {name: p.detach() - before[name] for name, p in model.named_parameters()}


def test_no_correction_trains_a_stale_batch_exactly_like_an_on_policy_one() -> None:
    stale_uncorrected = step_update("none", behaviour_from_model=False)
    on_policy = step_update("truncated_is", behaviour_from_model=True)
    for name, change in on_policy.items():
        torch.testing.assert_close(stale_uncorrected[name], change, rtol=1e-4, atol=1e-7)


def test_truncated_importance_sampling_weighs_a_stale_batch_differently() -> None:
    corrected = step_update("truncated_is", behaviour_from_model=False)
    uncorrected = step_update("none", behaviour_from_model=False)
    difference = sum(float((corrected[name] - uncorrected[name]).abs().sum()) for name in corrected)
    assert difference > 1e-3
