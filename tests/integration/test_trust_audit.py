"""Spot audits with a real tiny model (services/learner/audit.py): a group sampled by the worker engine with
version v's weights matches a re-scoring at v to engine precision; a group sampled with version v - 5's
weights while claiming v does not. Then the statistic path: the learner's pi_prox (version v + 1) against
both, and the trust score the audits produce."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from engines.torch_engine import TorchEngine
from services.learner import trainer
from services.learner.audit import Auditor
from services.learner.batch import AdmittedGroup, tensorize
from services.learner.grpo import token_logprobs
from services.learner.trust import TrustTracker, group_statistics
from services.rollout.worker import build_rollout_group
from shared.bus import Delivery
from shared.config import TrustConfig
from shared.messages import ScoredGroup, TaskGroup

pytestmark = pytest.mark.integration

CONFIG = TrustConfig(audit_fraction=1.0, audit_keep_versions=8)


def scored_group(engine: TorchEngine, state: dict[str, torch.Tensor], claimed_version: int) -> ScoredGroup:
    """8 samples of "3+4=" by the worker engine holding `state`, posted as sampled by `claimed_version`."""
    engine.load_state_dict(state, claimed_version)
    task = TaskGroup(
        run_id="r",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="3+4=",
        num_samples=8,
        max_new_tokens=2,
        temperature=1.0,
    )
    (samples,) = engine.generate([task.prompt], 8, 2, 1.0)
    rollout = build_rollout_group(task, samples, "w-honest", claimed_version, 0.01)
    return ScoredGroup(run_id="r", rollout=rollout, rewards=[0.0] * 8)


def test_an_audit_at_the_claimed_version_catches_older_weights(model_dir: Path) -> None:
    torch.manual_seed(0)
    model, tokenizer = trainer.load_policy(model_dir)
    auditor = Auditor(model, CONFIG, seed=0)
    versions: dict[int, dict[str, torch.Tensor]] = {}
    for version in range(8):  # versions 0..7, each one update (a perturbation) after the last
        auditor.remember(version, model)
        versions[version] = copy.deepcopy(model.state_dict())
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.02)
    model.load_state_dict(versions[7])  # the learner at t = 7
    engine = TorchEngine(model_dir)
    honest = scored_group(engine, versions[6], claimed_version=6)
    stale = scored_group(engine, versions[1], claimed_version=6)  # v - 5's weights, claiming v
    stale = stale.model_copy(update={"rollout": stale.rollout.model_copy(update={"worker_id": "w-stale"})})

    groups = [
        AdmittedGroup(Delivery("scored", "learner", f"{i}-0", g, 1), 1, False) for i, g in enumerate((honest, stale))
    ]
    tensors = tensorize([a.group for a in groups], tokenizer.pad_token_id or 0, True)
    with torch.no_grad():
        pi_prox = token_logprobs(model, tensors.input_ids, tensors.attention_mask, tensors.temperatures)
    statistics = group_statistics(groups, tensors, pi_prox)
    honest_check, stale_check = auditor.check(groups, statistics, tensors)

    assert honest_check.exact_diff_nats is not None and stale_check.exact_diff_nats is not None
    assert honest_check.exact_diff_nats < 1e-4 < CONFIG.audit_tolerance_nats  # engine precision
    assert stale_check.exact_diff_nats > 10 * CONFIG.audit_tolerance_nats
    assert 0 < honest_check.audit_s < 1.0  # one no-grad forward of 8 short rows on the demo model

    tracker = TrustTracker(CONFIG)
    for stat, check in zip(statistics, (honest_check, stale_check), strict=True):
        tracker.observe(stat.worker_id, stat.lag, stat.abs_diff_nats, check.exact_diff_nats)
    trust = tracker.snapshot()
    assert trust["w-honest"].num_audit_failures == 0 and trust["w-honest"].score == 0.0
    assert trust["w-stale"].num_audit_failures == 1 and trust["w-stale"].score >= CONFIG.audit_failure_weight


def test_versions_this_process_did_not_publish_are_not_audited(model_dir: Path) -> None:
    model, tokenizer = trainer.load_policy(model_dir)
    auditor = Auditor(model, CONFIG, seed=0)
    engine = TorchEngine(model_dir)
    group = scored_group(engine, model.state_dict(), claimed_version=3)  # created before version 3 is published
    auditor.remember(3, model)
    admitted = [AdmittedGroup(Delivery("scored", "learner", "1-0", group, 1), 1, False)]
    tensors = tensorize([group], tokenizer.pad_token_id or 0, True)
    statistics = group_statistics(admitted, tensors, torch.zeros_like(tensors.behaviour_logprobs))
    assert auditor.check(admitted, statistics, tensors)[0].exact_diff_nats is None
