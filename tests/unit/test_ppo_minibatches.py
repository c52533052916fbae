"""PPO minibatch updates on a tiny real Qwen2: one minibatch is the old single update, several make the
clip bind and take that many optimizer steps, minibatches hold whole groups, pi_prox stays the step's
start, and the importance-weight diagnostics (ESS) read what they should."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from pydantic import ValidationError
from transformers import Qwen2ForCausalLM

from services.learner.batch import TrainBatch
from services.learner.grpo import group_advantages, importance_stats, policy_loss, token_logprobs
from services.learner.trainer import disable_dropout, group_rows, minibatch_plan, train_step
from shared.config import GRPOConfig, LearnerConfig
from tests import tiny_models

torch.set_num_threads(1)

VOCAB = 40


def tiny_qwen2() -> Qwen2ForCausalLM:
    return tiny_models.tiny_qwen2(VOCAB)


def grouped_batch(model: torch.nn.Module, num_groups: int, group_size: int, seed: int = 1) -> TrainBatch:
    """num_groups groups of group_size rows (3-token prompt, 2-6 completion tokens, right-padded) with
    group-relative advantages; behaviour log-probs are the model's own, plus noise (a slightly stale mu)."""
    generator = torch.Generator().manual_seed(seed)
    num_rows, num_positions = num_groups * group_size, 9
    lengths = torch.randint(5, num_positions + 1, (num_rows,), generator=generator)
    lengths[0] = num_positions
    attention_mask = (torch.arange(num_positions)[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(1, VOCAB, (num_rows, num_positions), generator=generator) * attention_mask
    completion_mask = torch.zeros((num_rows, num_positions - 1), dtype=torch.bool)
    for i, length in enumerate(lengths.tolist()):
        completion_mask[i, 2 : length - 1] = True
    temperatures = torch.ones(num_rows)
    with torch.no_grad():
        own = token_logprobs(model, input_ids, attention_mask, temperatures)
    noise = 0.3 * torch.randn(own.shape, generator=generator)
    rewards = torch.randint(0, 2, (num_rows,), generator=generator).float()
    advantages = torch.cat([group_advantages(group, True) for group in rewards.split(group_size)])
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        behaviour_logprobs=(own + noise) * completion_mask,
        advantages=advantages[:, None],
        temperatures=temperatures,
        rewards=rewards,
    )


def old_single_update(
    model: Qwen2ForCausalLM, optimizer: torch.optim.Optimizer, batch: TrainBatch, grpo: GRPOConfig
) -> None:
    """trainer.train_step before minibatches: one forward over the batch, pi_prox = its own detached
    log-probs, backward, clip, one AdamW step."""
    disable_dropout(model)
    optimizer.zero_grad(set_to_none=True)
    logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures, chunk_tokens=1024)
    loss, _ = policy_loss(
        logprobs,
        proximal_logprobs=logprobs.detach(),
        behaviour_logprobs=batch.behaviour_logprobs,
        advantages=batch.advantages,
        completion_mask=batch.completion_mask,
        clip_eps=grpo.clip_eps,
        max_importance_weight=grpo.max_importance_weight,
        loss_num_tokens=batch.num_tokens,
    )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.max_grad_norm)
    optimizer.step()


def optimizer_steps(optimizer: torch.optim.Optimizer) -> set[int]:
    return {int(state["step"]) for state in optimizer.state.values()}


def test_one_minibatch_is_the_old_single_update_and_never_clips() -> None:
    grpo = GRPOConfig(group_size=4, groups_per_step=4, learning_rate=1e-2, num_minibatches=1)
    new_model = tiny_qwen2()
    batch = grouped_batch(new_model, num_groups=4, group_size=4)
    old_model = copy.deepcopy(new_model)
    new_optimizer = torch.optim.AdamW(new_model.parameters(), lr=grpo.learning_rate)
    old_optimizer = torch.optim.AdamW(old_model.parameters(), lr=grpo.learning_rate)

    result = train_step(new_model, new_optimizer, batch, grpo)
    old_single_update(old_model, old_optimizer, batch, grpo)

    assert result.diagnostics.num_updates == 1 and optimizer_steps(new_optimizer) == {1}
    assert result.diagnostics.clip_fraction == 0.0
    moved = 0.0
    for (name, new), old, start in zip(
        new_model.named_parameters(), old_model.parameters(), tiny_qwen2().parameters(), strict=True
    ):
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, float((new - start).detach().abs().max()))
    assert moved > 1e-3  # the update did something to compare


def test_four_minibatches_take_four_optimizer_steps_and_the_clip_binds_after_the_first() -> None:
    grpo = GRPOConfig(group_size=4, groups_per_step=8, learning_rate=0.05, num_minibatches=4)
    model = tiny_qwen2()
    batch = grouped_batch(model, num_groups=8, group_size=4)
    start = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=grpo.learning_rate)

    result = train_step(model, optimizer, batch, grpo, shuffle_seed=3)

    assert result.diagnostics.num_updates == 4 and optimizer_steps(optimizer) == {4}
    assert result.diagnostics.clip_fraction > 0.0  # pi_theta left the trust region around pi_prox
    assert result.diagnostics.clip_fraction < 0.75  # the first minibatch (a quarter of the groups) is never clipped
    # StepResult.logprobs keeps its meaning for the trust monitor and the mismatch: pi_prox, the step's start.
    with torch.no_grad():
        at_start = token_logprobs(start, batch.input_ids, batch.attention_mask, batch.temperatures)
    torch.testing.assert_close(result.logprobs, at_start, rtol=0, atol=1e-5)
    with torch.no_grad():
        after = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures)
    assert float((after - at_start)[batch.completion_mask].abs().max()) > 0.2


def test_epochs_multiply_the_updates_and_micro_batches_do_not_change_them() -> None:
    grpo = GRPOConfig(group_size=4, groups_per_step=4, learning_rate=1e-2, num_minibatches=2, ppo_epochs=2)
    results, models = [], []
    for micro_batch_size in (0, 3):
        model = tiny_qwen2()
        batch = grouped_batch(model, num_groups=4, group_size=4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=grpo.learning_rate)
        learner = LearnerConfig(micro_batch_size=micro_batch_size)
        results.append(train_step(model, optimizer, batch, grpo, learner, shuffle_seed=5))
        models.append(model)
        assert optimizer_steps(optimizer) == {4}
    whole, micro = results
    assert whole.diagnostics.num_updates == micro.diagnostics.num_updates == 4
    assert micro.diagnostics.loss == pytest.approx(whole.diagnostics.loss, rel=1e-4, abs=1e-6)
    # Inside a minibatch the micro-batch gradients add up to its token mean: the same updates.
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_minibatches_hold_whole_groups_and_each_epoch_covers_every_row_once() -> None:
    sizes = [4, 4, 2, 4, 4, 3, 4]
    groups = [set(rows.tolist()) for rows in group_rows(sum(sizes), sizes, 4)]
    grpo = GRPOConfig(group_size=4, groups_per_step=7, num_minibatches=3, ppo_epochs=2)
    plan = minibatch_plan(sum(sizes), grpo, sizes, shuffle_seed=11)

    assert len(plan) == 6
    for epoch in (plan[:3], plan[3:]):
        rows = [row for minibatch in epoch for row in minibatch.tolist()]
        assert sorted(rows) == list(range(sum(sizes)))  # every row once per epoch
        group_counts = []
        for minibatch in epoch:
            members = set(minibatch.tolist())
            whole = [group for group in groups if group <= members]
            assert set().union(*whole) == members  # nothing but whole groups
            assert minibatch.tolist() == sorted(members)  # in batch order
            group_counts.append(len(whole))
        assert max(group_counts) - min(group_counts) <= 1
    assert [m.tolist() for m in plan[:3]] != [m.tolist() for m in plan[3:]]  # reshuffled per epoch
    again = minibatch_plan(sum(sizes), grpo, sizes, shuffle_seed=11)
    assert [m.tolist() for m in again] == [m.tolist() for m in plan]  # seeded: a retaken step splits the same
    other = minibatch_plan(sum(sizes), grpo, sizes, shuffle_seed=12)
    assert [m.tolist() for m in other] != [m.tolist() for m in plan]


def test_a_batch_that_is_not_whole_groups_or_too_few_groups_is_refused() -> None:
    grpo = GRPOConfig(group_size=4, groups_per_step=4, num_minibatches=2)
    with pytest.raises(ValueError, match="not whole groups"):
        minibatch_plan(10, grpo, None, shuffle_seed=0)
    with pytest.raises(ValueError, match="do not cover"):
        minibatch_plan(10, grpo, [4, 4], shuffle_seed=0)
    with pytest.raises(ValueError, match="cannot fill num_minibatches = 2"):
        minibatch_plan(4, grpo, [4], shuffle_seed=0)
    assert [m.tolist() for m in minibatch_plan(7, GRPOConfig(), None, shuffle_seed=0)] == [list(range(7))]


def test_ess_is_one_on_policy_and_the_kish_formula_off_policy() -> None:
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    proximal = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.3], [0.1, 0.6, 0.5, 0.5]]))
    on_policy = importance_stats(proximal, proximal.clone(), mask, max_importance_weight=5.0)
    assert (on_policy.weight_mean, on_policy.weight_max, on_policy.truncated_fraction) == (1.0, 1.0, 0.0)
    assert on_policy.ess_fraction == pytest.approx(1.0, abs=1e-12) and on_policy.num_tokens == 5

    behaviour = torch.log(torch.tensor([[0.25, 0.2, 0.1, 1e-30], [0.1, 0.3, 0.5, 0.5]]))
    stats = importance_stats(proximal, behaviour, mask, max_importance_weight=5.0)
    weights = [2.0, 1.0, 9.0, 1.0, 2.0]  # pi_prox / mu on the five completion tokens
    assert stats.weight_mean == pytest.approx(sum(weights) / 5)
    assert stats.weight_max == pytest.approx(9.0)
    assert stats.truncated_fraction == pytest.approx(1 / 5)
    assert stats.ess_fraction == pytest.approx(sum(weights) ** 2 / (5 * sum(w * w for w in weights)))
    assert stats.ess_fraction < 1.0


def test_ess_stays_finite_when_a_weight_overflows_float32() -> None:
    mask = torch.tensor([[True, True]])
    stats = importance_stats(torch.tensor([[0.0, 0.0]]), torch.tensor([[-200.0, 0.0]]), mask, 5.0)
    assert math.isfinite(stats.weight_max) and stats.ess_fraction == pytest.approx(0.5, rel=1e-9)


def test_the_step_reports_ess_one_when_behaviour_is_the_proximal_policy_and_less_when_stale() -> None:
    grpo = GRPOConfig(group_size=4, groups_per_step=2, num_minibatches=2)
    model = tiny_qwen2()
    batch = grouped_batch(model, num_groups=2, group_size=4)
    with torch.no_grad():
        own = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures)
    fresh = dataclasses.replace(batch, behaviour_logprobs=own * batch.completion_mask)
    fresh_model = copy.deepcopy(model)
    fresh_result = train_step(fresh_model, torch.optim.AdamW(fresh_model.parameters()), fresh, grpo)
    stale_result = train_step(model, torch.optim.AdamW(model.parameters()), batch, grpo)
    assert fresh_result.diagnostics.ess_fraction == pytest.approx(1.0, abs=1e-5)
    assert fresh_result.diagnostics.is_weight_max == pytest.approx(1.0, abs=1e-4)
    assert stale_result.diagnostics.ess_fraction < 0.99
    assert stale_result.diagnostics.is_weight_max > 1.1


def test_the_run_file_bounds_num_minibatches_by_the_groups_per_step() -> None:
    assert GRPOConfig().num_minibatches == 1 and GRPOConfig().ppo_epochs == 1 and GRPOConfig().num_updates == 1
    assert GRPOConfig(groups_per_step=8, num_minibatches=4, ppo_epochs=2).num_updates == 8
    with pytest.raises(ValidationError, match=r"num_minibatches \(9\) exceeds groups_per_step \(8\)"):
        GRPOConfig(groups_per_step=8, num_minibatches=9)
    for field in ("num_minibatches", "ppo_epochs"):
        with pytest.raises(ValidationError, match=field):
            GRPOConfig(**{field: 0})
