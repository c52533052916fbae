"""GRPO math against hand computations: advantages, the decoupled clipped loss, token log-probs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from services.learner.grpo import ADVANTAGE_EPS, group_advantages, policy_loss, token_logprobs
from services.learner.trainer import load_policy

torch.set_num_threads(1)


def test_advantages_subtract_the_group_mean_and_divide_by_the_population_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
    mean, std = 0.5, math.sqrt((4 * 0.25) / 5)
    expected = [(r - mean) / (std + ADVANTAGE_EPS) for r in rewards.tolist()]
    assert group_advantages(rewards, normalize_by_std=True).tolist() == pytest.approx(expected, rel=1e-6)
    assert group_advantages(rewards, normalize_by_std=False).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0])


@pytest.mark.parametrize("normalize_by_std", [True, False])
def test_equal_rewards_and_single_samples_carry_no_signal(normalize_by_std: bool) -> None:
    assert group_advantages(torch.full((8,), 0.5), normalize_by_std).tolist() == [0.0] * 8
    assert group_advantages(torch.tensor([1.0]), normalize_by_std).tolist() == [0.0]  # no NaN from a group of one


def test_policy_loss_matches_a_hand_computation_with_clipping_on_both_sides_and_truncation() -> None:
    eps, cap = 0.2, 2.0
    # Row 0 has advantage +2, row 1 advantage -1. Per token: (log pi_theta, log pi_prox, log mu).
    new = torch.tensor(
        [[math.log(0.6), math.log(0.45), math.log(0.3), 0.0], [math.log(0.2), math.log(0.5), math.log(0.5), 0.0]],
        requires_grad=True,
    )
    prox = torch.tensor(
        [[math.log(0.4), math.log(0.5), math.log(0.3), 0.0], [math.log(0.4), math.log(0.5), math.log(0.1), 0.0]]
    )
    behaviour = torch.tensor(
        [
            [math.log(0.4), math.log(0.5), math.log(0.05), -1e30],  # last: padding, garbage
            [math.log(0.8), math.log(0.5), math.log(0.5), -1e30],
        ]
    )
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    advantages = torch.tensor([[2.0], [-1.0]])

    loss, stats = policy_loss(new, prox, behaviour, advantages, mask, clip_eps=eps, max_importance_weight=cap)

    # token: (r = new/prox, w = min(prox/mu, cap), A) -> -w * min(r A, clip(r) A)
    terms = [
        -1.0 * min(1.5 * 2, 1.2 * 2),  # r 1.5 clipped from above (A > 0)
        -1.0 * min(0.9 * 2, 0.9 * 2),  # r 0.9 inside the range
        -2.0 * min(1.0 * 2, 1.0 * 2),  # w = 0.3 / 0.05 = 6 truncated to 2
        -0.5 * min(0.5 * -1, 0.8 * -1),  # r 0.5 clipped from below (A < 0); w = 0.4 / 0.8
        -1.0 * min(1.0 * -1, 1.0 * -1),
        -min(0.1 / 0.5, cap) * min(5.0 * -1, 1.2 * -1),  # r 5 unclipped: the pessimistic side for A < 0
    ]
    assert loss.item() == pytest.approx(sum(terms) / 6, rel=1e-5)
    assert stats.num_tokens == 6
    assert stats.clip_fraction == pytest.approx(2 / 6)
    assert stats.truncated_fraction == pytest.approx(1 / 6)
    ratios = [0.6 / 0.4, 0.45 / 0.5, 0.3 / 0.05, 0.2 / 0.8, 1.0, 0.5 / 0.5]
    assert stats.ratio_mean == pytest.approx(sum(ratios) / 6, rel=1e-5)
    assert stats.approx_kl == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 6, rel=1e-5)
    loss.backward()
    assert torch.isfinite(new.grad).all()


def test_with_one_update_per_batch_the_gradient_is_the_truncated_weight_times_the_advantage() -> None:
    logprobs = torch.tensor([[-0.5, -1.0, -2.0]], requires_grad=True)
    behaviour = torch.tensor([[-0.5, -3.0, -2.5]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = policy_loss(
        logprobs, logprobs.detach(), behaviour, torch.tensor([[1.5]]), mask, clip_eps=0.2, max_importance_weight=5.0
    )
    loss.backward()
    # d loss / d logprob = -min(exp(prox - mu), cap) * A / num_tokens; nothing at masked positions.
    expected = [-1.0 * 1.5 / 2, -min(math.exp(2.0), 5.0) * 1.5 / 2, 0.0]
    assert logprobs.grad[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert stats.clip_fraction == 0.0


def test_token_logprobs_equal_a_manual_gather_per_row_despite_right_padding(tiny_policy_dir: Path) -> None:
    model, _ = load_policy(tiny_policy_dir)
    rows = [[7, 3, 8, 14, 5, 1], [4, 3, 4, 14, 4]]  # "3+4=1<eos>", "0+0=0"
    pad = 0
    input_ids = torch.tensor([row + [pad] * (6 - len(row)) for row in rows])
    attention_mask = (torch.arange(6)[None, :] < torch.tensor([[6], [5]])).long()
    temperatures = torch.tensor([0.7, 1.3])

    with torch.no_grad():
        batched = token_logprobs(model, input_ids, attention_mask, temperatures)
        for i, row in enumerate(rows):
            logits = model(input_ids=torch.tensor([row])).logits[0, :-1] / temperatures[i]
            manual = torch.log_softmax(logits, dim=-1)[torch.arange(len(row) - 1), torch.tensor(row[1:])]
            assert batched[i, : len(row) - 1].tolist() == pytest.approx(manual.tolist(), abs=1e-5)
