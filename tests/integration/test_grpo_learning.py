"""The learning check: a single-process GRPO loop (our sampler, tensorize, train_step) on "a+b=" ->
(a+b) mod 10 lifts the reward of a tiny random-init Qwen2 from chance. Settings of the demo run:
G = 8, 64 prompts per step, lr 1e-3 (docs/design.md#the-arithmetic-task-learns-on-a-cpu-in-minutes)."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest
import torch

from engines.interface import Sampling
from engines.torch_engine import TorchEngine
from services.learner.batch import tensorize
from services.learner.evaluate import evaluate_greedy
from services.learner.trainer import load_policy, make_optimizer, train_step
from shared.config import GRPOConfig
from shared.tasks import make_task
from tests.selfplay import sample_scored_groups

pytestmark = pytest.mark.integration  # real training runs: seconds, not the unit tier's milliseconds
torch.set_num_threads(1)


def train_on_self_play(policy_dir: Path, num_steps: int, seed: int = 0) -> tuple[list[float], list[float]]:
    """Returns (train reward mean per step, held-out greedy accuracy before and after)."""
    grpo = GRPOConfig()
    task = make_task("arithmetic_mod10", num_eval_prompts=20, seed=0)
    model, tokenizer = load_policy(policy_dir)
    optimizer = make_optimizer(model, grpo)
    prompt_rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)

    engine = TorchEngine(policy_dir)  # the learner's evaluation path: the workers' engine, greedy

    def accuracy() -> float:
        engine.load_state_dict(model.state_dict(), policy_version=0)
        return evaluate_greedy(engine, task, max_new_tokens=grpo.max_new_tokens).accuracy

    accuracies, rewards = [accuracy()], []
    for step in range(num_steps):
        prompts = [prompt_rng.choice(task.train_set) for _ in range(grpo.groups_per_step)]
        groups = sample_scored_groups(
            model,
            tokenizer,
            task,
            prompts,
            run_id="learning-check",
            policy_version=step,
            sampling=Sampling(grpo.group_size, grpo.max_new_tokens, grpo.temperature),
            generator=generator,
        )
        batch = tensorize(groups, tokenizer.pad_token_id, grpo.normalize_advantage_by_std)
        train_step(model, optimizer, batch, grpo)
        rewards.append(batch.rewards.mean().item())
    accuracies.append(accuracy())
    return rewards, accuracies


def test_grpo_lifts_the_train_reward_from_chance_within_seconds(tiny_policy_dir: Path) -> None:
    rewards, _ = train_on_self_play(tiny_policy_dir, num_steps=120)  # ~20 s on one thread
    first, last = statistics.fmean(rewards[:10]), statistics.fmean(rewards[-10:])
    assert first < 0.15, f"a random policy should be near chance, got {first:.2f}"
    assert last > first + 0.2, f"train reward {first:.2f} -> {last:.2f}"


@pytest.mark.slow
def test_grpo_generalises_to_held_out_prompts(tiny_policy_dir: Path) -> None:
    rewards, (accuracy_before, accuracy_after) = train_on_self_play(tiny_policy_dir, num_steps=300)  # ~60 s
    assert accuracy_before <= 0.2
    assert accuracy_after >= 0.8, f"held-out greedy accuracy {accuracy_before:.2f} -> {accuracy_after:.2f}"
    assert statistics.fmean(rewards[-10:]) >= 0.85
