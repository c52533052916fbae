"""The exact checks' tolerance is measured on the policy (services/learner/numerics.py): an honest bf16 engine
against a mixed-precision learner passes on a model with pretrained-like weights, where the old fixed 0.01
nats would fail it, and invented log-probs still fail."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from services.learner.batch import TrainBatch
from services.learner.grpo import token_logprobs
from services.learner.numerics import NUMERICS_WINDOW_STEPS, NumericsReference
from services.learner.policy import Policy
from services.learner.trust import TrustTracker, group_abs_diffs
from shared.config import LearnerConfig, RunConfig, TrustConfig
from tests import tiny_models
from tests.sharded_step import GROUP_SIZES, fixed_batch

NUM_BATCHES = 6


@pytest.fixture(scope="module")
def mixed_policy(tiny_policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Policy:
    folder = tiny_models.pretrained_like_folder(tiny_policy_dir, tmp_path_factory.mktemp("pretrained-like"))
    return Policy(folder, RunConfig(learner=LearnerConfig(device="cpu", precision="mixed")))


def batches(policy: Policy) -> list[TrainBatch]:
    return [fixed_batch(policy.config.vocab_size, seed=seed, num_positions=24) for seed in range(NUM_BATCHES)]


def learner_logprobs(policy: Policy, batch: TrainBatch) -> torch.Tensor:
    """pi as the learner computes it: bf16 autocast on its float32 masters."""
    with torch.no_grad(), policy.precision.compute():
        return token_logprobs(policy.model, batch.input_ids, batch.attention_mask, batch.temperatures)


def bf16_engine_logprobs(policy: Policy, batch: TrainBatch) -> torch.Tensor:
    """mu as an honest bf16 engine reports it: the published (bf16) weights, every operation in bf16."""
    engine = copy.deepcopy(policy.model).to(torch.bfloat16)
    with torch.no_grad():
        return token_logprobs(engine, batch.input_ids, batch.attention_mask, batch.temperatures).float()


def group_diffs(pi: torch.Tensor, mu: torch.Tensor, batch: TrainBatch) -> list[float]:
    return [diff for _, diff in group_abs_diffs(pi, mu, batch.completion_mask, GROUP_SIZES)]


def test_an_honest_bf16_engine_passes_the_measured_tolerance_where_the_old_constant_failed_it(
    mixed_policy: Policy,
) -> None:
    numerics = NumericsReference(TrustConfig(), seed=0)
    honest: list[float] = []
    for batch in batches(mixed_policy):
        assert numerics.measure(mixed_policy.model, batch) is not None
        honest += group_diffs(learner_logprobs(mixed_policy, batch), bf16_engine_logprobs(mixed_policy, batch), batch)
    tolerance = numerics.tolerance_nats
    print(f"tolerance {tolerance:.4f}, honest bf16 group diffs {min(honest):.4f}..{max(honest):.4f}")
    assert max(honest) < tolerance
    assert sum(diff > TrustConfig().audit_tolerance_nats for diff in honest) > len(honest) / 2  # 0.01 was too tight
    assert tolerance < 0.1  # and the measured one is no blank cheque: see the liars below


def test_invented_logprobs_and_a_temperature_lie_fail_the_measured_tolerance(mixed_policy: Policy) -> None:
    numerics = NumericsReference(TrustConfig(), seed=0)
    generator = torch.Generator().manual_seed(1)
    for batch in batches(mixed_policy):
        numerics.measure(mixed_policy.model, batch)
        pi = learner_logprobs(mixed_policy, batch)
        garbage = -torch.rand(pi.shape, generator=generator) * 8  # garbage_logprobs: uniform in [-8, 0]
        assert min(group_diffs(pi, garbage, batch)) > numerics.tolerance_nats
        hotter = fixed_batch(mixed_policy.config.vocab_size, seed=0, num_positions=24)
        hotter.temperatures.mul_(1.5)  # sampled at 1.5x the run's temperature, log-probs of that distribution
        lie = bf16_engine_logprobs(mixed_policy, hotter)
        batch0 = fixed_batch(mixed_policy.config.vocab_size, seed=0, num_positions=24)
        assert min(group_diffs(learner_logprobs(mixed_policy, batch0), lie, batch0)) > numerics.tolerance_nats


def test_the_tolerance_is_the_floor_until_measured_and_a_median_one_outlier_cannot_move() -> None:
    config = TrustConfig()
    numerics = NumericsReference(config)  # the tolerance: 3x the median of the last 16 steps' references
    assert numerics.tolerance_nats == config.audit_tolerance_nats
    numerics.references_nats.extend([0.02, 0.021, 0.019, 0.02])
    assert numerics.tolerance_nats == pytest.approx(0.06)
    numerics.references_nats.append(5.0)  # a step whose rows were all one liar's strangest tokens
    assert numerics.tolerance_nats == pytest.approx(0.06)
    numerics.references_nats.extend([1e-7] * NUMERICS_WINDOW_STEPS)  # float32-exact numerics: the floor holds
    assert numerics.tolerance_nats == config.audit_tolerance_nats
    off = NumericsReference(TrustConfig(numerics_rows=0))
    assert off.measure(torch.nn.Linear(1, 1), fixed_batch(16, seed=0)) is None
    assert off.tolerance_nats == TrustConfig().audit_tolerance_nats


def test_the_tracker_keeps_an_honest_bf16_worker_and_quarantines_a_garbage_one_with_the_tolerance(
    mixed_policy: Policy,
) -> None:
    config = TrustConfig()
    tracker = TrustTracker(config)
    numerics = NumericsReference(config, seed=0)
    generator = torch.Generator().manual_seed(2)
    num_groups_until_suspect = None
    for step, batch in enumerate(batches(mixed_policy) * 3):
        numerics.measure(mixed_policy.model, batch)
        pi = learner_logprobs(mixed_policy, batch)
        for diff in group_diffs(pi, bf16_engine_logprobs(mixed_policy, batch), batch):
            tracker.observe("honest", 0, diff, diff, numerics.tolerance_nats)
        for index, diff in enumerate(group_diffs(pi, -torch.rand(pi.shape, generator=generator) * 8, batch)):
            tracker.observe("liar", 0, diff, diff, numerics.tolerance_nats)
            if tracker.scores["liar"].suspect and num_groups_until_suspect is None:
                num_groups_until_suspect = step * len(GROUP_SIZES) + index + 1
    assert not tracker.scores["honest"].suspect and tracker.scores["honest"].num_audit_failures == 0
    assert num_groups_until_suspect == 2
