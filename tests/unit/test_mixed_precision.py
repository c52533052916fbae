"""Mixed precision (services/learner/precision.py): float32 masters and AdamW state with bf16 compute
learn like float32 at a pretrained model's learning rate; pure bf16 does not, which is why mixed is the
default (docs/precision.md).

The model: the demo's tiny Qwen2 with pretrained-like weight magnitudes (tests/tiny_models.py
pretrained_like_folder), saved as a bf16 checkpoint, so every precision starts from the same weights.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.learner.grpo import token_logprobs
from services.learner.policy import Policy
from services.learner.publish import publication_state
from shared.config import GRPOConfig, LearnerConfig, LoraConfig, RunConfig
from tests import tiny_models
from tests.sharded_step import GROUP_SIZES, fixed_batch

ADAM_EPS = 1e-8  # torch.optim.AdamW's default: an element whose gradient is below it takes a step << lr


@pytest.fixture(scope="module")
def pretrained_like_dir(tiny_policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.pretrained_like_folder(tiny_policy_dir, tmp_path_factory.mktemp("pretrained-like"))


def make_policy(folder: Path, precision: str, learning_rate: float, lora: bool = False) -> Policy:
    run = RunConfig(
        grpo=GRPOConfig(group_size=2, groups_per_step=3, learning_rate=learning_rate),
        learner=LearnerConfig(device="cpu", precision=precision),  # type: ignore[arg-type]
        lora=LoraConfig(enabled=lora, rank=4),
    )
    return Policy(folder, run)


def reference_logprobs(folder: Path, policy: Policy) -> torch.Tensor:
    """(B, T - 1) log-probs of the fixed batch under the policy's weights, in float64: the yardstick
    that neither precision's own rounding touches."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    model.load_state_dict({name: tensor.double() for name, tensor in policy.model.state_dict().items()})
    batch = fixed_batch(policy.config.vocab_size, seed=0)
    with torch.no_grad():
        return token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures.double())


def advantage_weighted_gain(folder: Path, precision: str, learning_rate: float, num_steps: int = 3) -> float:
    """Mean over completion tokens of A * (log pi_after - log pi_before) after num_steps learner steps on
    one fixed batch: what the GRPO objective asks the update to raise."""
    policy = make_policy(folder, precision, learning_rate)
    batch = fixed_batch(policy.config.vocab_size, seed=0)
    before = reference_logprobs(folder, policy)
    for step in range(num_steps):
        policy.train_step(batch, GROUP_SIZES, shuffle_seed=step)
    moved = (reference_logprobs(folder, policy) - before) * batch.advantages.double() * batch.completion_mask
    return float(moved.sum() / batch.completion_mask.sum())


def fraction_changed_by_one_step(policy: Policy) -> tuple[float, int, int]:
    """(fraction of all trainable elements that changed, elements with |grad| > Adam's eps, of those the
    number that changed) over one learner step on the fixed batch."""
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters() if p.requires_grad}
    policy.train_step(fixed_batch(policy.config.vocab_size, seed=0), GROUP_SIZES, shuffle_seed=0)
    num_changed = num_total = num_with_gradient = num_with_gradient_changed = 0
    for name, parameter in policy.model.named_parameters():
        if not parameter.requires_grad:
            continue
        changed = parameter.detach() != before[name]
        assert parameter.grad is not None
        has_gradient = parameter.grad.abs() > ADAM_EPS  # after clipping: what AdamW stepped with
        num_changed += int(changed.sum())
        num_total += parameter.numel()
        num_with_gradient += int(has_gradient.sum())
        num_with_gradient_changed += int((changed & has_gradient).sum())
    return num_changed / num_total, num_with_gradient, num_with_gradient_changed


def test_mixed_precision_moves_every_master_element_that_has_a_gradient_at_lr_1e6(pretrained_like_dir: Path) -> None:
    policy = make_policy(pretrained_like_dir, "mixed", 1e-6)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}  # the masters
    assert policy.precision.compute_dtype == torch.bfloat16
    _, num_with_gradient, num_changed = fraction_changed_by_one_step(policy)
    assert num_with_gradient > 0.99 * sum(p.numel() for p in policy.model.parameters())
    assert num_changed == num_with_gradient
    assert {state["exp_avg"].dtype for state in policy.optimizer.state.values()} == {torch.float32}


def test_pure_bf16_loses_most_updates_at_lr_1e6_which_is_why_mixed_is_the_default(
    pretrained_like_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="services.learner.precision"):
        policy = make_policy(pretrained_like_dir, "bf16", 1e-6)
    assert "only weights with |w| < 5.1e-04 can move" in caplog.text  # the smallest update, stated
    fraction_changed, num_with_gradient, num_changed = fraction_changed_by_one_step(policy)
    # 8 significant bits: an update of ~1e-6 cannot change a weight of |w| > ~5e-4 (measured: 0.25%)
    assert fraction_changed < 0.02
    assert num_changed < 0.02 * num_with_gradient


@pytest.mark.parametrize("learning_rate", [1e-6, 1e-5])
def test_mixed_precision_gains_what_float32_gains_and_pure_bf16_does_not(
    pretrained_like_dir: Path, learning_rate: float
) -> None:
    float32 = advantage_weighted_gain(pretrained_like_dir, "fp32", learning_rate)
    mixed = advantage_weighted_gain(pretrained_like_dir, "mixed", learning_rate)
    bf16 = advantage_weighted_gain(pretrained_like_dir, "bf16", learning_rate)
    assert float32 > 0
    # measured 0.4% apart at both rates: bf16 matmuls perturb the gradient, not the update's size
    assert mixed == pytest.approx(float32, rel=0.05)
    assert bf16 < 0.1 * float32  # measured 0.4% (lr 1e-6) and 2.6% (lr 1e-5) of float32's gain


def test_mixed_precision_publishes_the_checkpoint_dtype_and_checkpoints_the_masters(pretrained_like_dir: Path) -> None:
    policy = make_policy(pretrained_like_dir, "mixed", 1e-6)
    policy.train_step(fixed_batch(policy.config.vocab_size, seed=0), GROUP_SIZES, shuffle_seed=0)
    published = publication_state(policy.weights(), policy.precision.publish_dtype)
    assert {tensor.dtype for tensor in published.values()} == {torch.bfloat16}
    model_state, optimizer_state = policy.checkpoint_state()
    assert {tensor.dtype for tensor in model_state.values()} == {torch.float32}
    resumed = make_policy(pretrained_like_dir, "mixed", 1e-6)
    resumed.restore(model_state, optimizer_state)
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, model_state[name]), name  # bit-identical masters: nothing re-rounded


def test_mixed_precision_lora_trains_float32_adapters_on_a_bf16_base(pretrained_like_dir: Path) -> None:
    policy = make_policy(pretrained_like_dir, "mixed", 1e-3, lora=True)
    trainable = {p.dtype for p in policy.model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in policy.model.parameters() if not p.requires_grad}
    assert (trainable, frozen) == ({torch.float32}, {torch.bfloat16})
    fraction_changed, _, _ = fraction_changed_by_one_step(policy)
    assert fraction_changed > 0.4  # B starts at 0 and moves; A moves where B's gradient reaches it
