"""Keyed sampling (shared/keyed_sampling.py): the draws follow softmax exactly (chi-square), are a pure
function of (seed, position), and the verifier's gap is 0 for keyed picks and positive for others."""

from __future__ import annotations

import torch

from engines.keyed_tensors import choice_gaps, keyed_choice, keyed_uniform
from shared.keyed_sampling import MAX_SEED, sample_seeds, task_seed

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_draws_follow_the_distribution_over_seeds_and_over_positions() -> None:
    probs = torch.softmax(LOGITS / 0.7, dim=-1)
    num_draws = 100_000
    over_seeds = keyed_choice(probs.expand(num_draws, -1), torch.arange(1, num_draws + 1), torch.zeros(num_draws))
    over_positions = keyed_choice(probs.expand(num_draws, -1), torch.full((num_draws,), 77), torch.arange(num_draws))
    for tokens in (over_seeds, over_positions):
        counts = torch.bincount(tokens, minlength=len(LOGITS)).double()
        # 5 degrees of freedom: P(chi2 > 20.5) = 0.001
        assert chi_square(counts, probs.double()) < 20.5


def test_uniforms_are_a_pure_function_of_seed_and_position_and_in_the_open_interval() -> None:
    seeds, positions = torch.tensor([1, 1, 2, MAX_SEED]), torch.tensor([0, 1, 0, 5])
    first, second = keyed_uniform(seeds, positions), keyed_uniform(seeds.clone(), positions.clone())
    assert torch.equal(first, second)
    assert len(set(first.tolist())) == 4
    many = keyed_uniform(torch.arange(100_000), torch.zeros(100_000))
    assert 0.0 < float(many.min()) and float(many.max()) < 1.0
    assert abs(float(many.mean()) - 0.5) < 0.005


def test_task_seeds_leave_room_for_every_sample_and_differ_by_task() -> None:
    seeds = [task_seed(f"task-{i}") for i in range(1_000)]
    assert all(1 <= seed < MAX_SEED for seed in seeds)
    assert len(set(seeds)) == 1_000
    assert sample_seeds("task-1", 3) == [task_seed("task-1") + j for j in range(3)]


def test_gaps_are_zero_for_keyed_picks_and_positive_for_other_seeds() -> None:
    logprobs = torch.log_softmax(torch.randn(2_000, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    seeds, positions = torch.arange(2_000) + 10, torch.arange(2_000) % 40
    picks = keyed_choice(logprobs.exp(), seeds, positions)
    assert float(choice_gaps(logprobs, picks, seeds, positions).max()) == 0.0
    cherry_picked = keyed_choice(logprobs.exp(), seeds + 1, positions)  # drawn with another seed
    gaps = choice_gaps(logprobs, cherry_picked, seeds, positions)
    changed = cherry_picked != picks
    assert bool((gaps[changed] > 0).all()) and float(changed.float().mean()) > 0.5
