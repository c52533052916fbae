"""Spot audits with a real tiny model (services/learner/audit.py): a group sampled by the worker engine with
version v's weights matches a re-scoring at v to engine precision; a group sampled with version v - 5's
weights while claiming v does not. Then the statistic path: the learner's pi_prox (version v + 1) against
both, and the trust score the audits produce."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from engines.interface import Sampling
from engines.torch_engine import TorchEngine
from services.learner import trainer
from services.learner.audit import Auditor
from services.learner.batch import AdmittedGroup, tensorize
from services.learner.grpo import token_logprobs
from services.learner.trust import AUDIT_FAILURE_WEIGHT, TrustTracker, group_statistics
from services.rollout.rollout_groups import build_rollout_group
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
    (samples,) = engine.generate([task.prompt], Sampling(8, 2, 1.0))
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
    assert trust["w-stale"].num_audit_failures == 1 and trust["w-stale"].score >= AUDIT_FAILURE_WEIGHT


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


def test_a_group_whose_samples_saw_new_weights_land_is_audited_token_by_token(model_dir: Path) -> None:
    """Continuous batching: version 6 lands while the samples of version 5 decode. Audited with each token's
    own version, the honest group matches to engine precision and its keyed picks check out; the same tokens
    claimed as all version 5 do not match."""
    from engines.continuous import SampleRequest
    from shared.keyed_sampling import sample_seeds
    from shared.messages import pack_int32

    torch.manual_seed(0)
    model, tokenizer = trainer.load_policy(model_dir)
    auditor = Auditor(model, CONFIG, seed=0)
    versions: dict[int, dict[str, torch.Tensor]] = {}
    for version in (5, 6):
        auditor.remember(version, model)
        versions[version] = copy.deepcopy(model.state_dict())
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.05)
    engine = TorchEngine(model_dir)
    engine.load_state_dict(versions[5], 5)
    task = TaskGroup(
        run_id="r", task_id="t-mixed", task_name="arithmetic_mod10", prompt="3+4=", num_samples=8,
        max_new_tokens=12, temperature=1.0,
    )  # fmt: skip
    (prompt_ids,) = engine.encode_prompts([task.prompt], task.max_new_tokens)
    batch = engine.continuous_batch(max_rows=8)
    seeds = sample_seeds(task.task_id, task.num_samples)
    batch.add([SampleRequest(j, tuple(prompt_ids), Sampling(1, 12, 1.0), seed) for j, seed in enumerate(seeds)])
    finished = {done.request_id: done for done in batch.step()}
    engine.load_state_dict(versions[6], 6)  # between two steps
    while batch.num_running:
        finished.update((done.request_id, done) for done in batch.step())
    samples = [finished[j] for j in range(task.num_samples)]
    changes = [
        (j, c.token_index, c.policy_version) for j, s in enumerate(samples) for c in s.versions if c.policy_version > 5
    ]
    assert changes, "some samples were in flight at the swap"

    rollout = build_rollout_group(
        task,
        [s.sample for s in samples],
        "w-honest",
        5,
        0.01,
        version_changes=pack_int32([v for c in changes for v in c]),
    )
    claimed_old = rollout.model_copy(update={"version_changes": b"", "worker_id": "w-claims-5"})
    groups = [
        AdmittedGroup(
            Delivery("scored", "learner", f"{i}-0", ScoredGroup(run_id="r", rollout=r, rewards=[0.0] * 8), 1), 1, False
        )
        for i, r in enumerate((rollout, claimed_old))
    ]
    # per_token admission at a step where version 5 is too old: its tokens are masked out of the loss, and
    # the audit still checks every token the worker sampled, each against its own version
    for oldest_trained_version in (None, 6):
        tensors = tensorize([a.group for a in groups], tokenizer.pad_token_id or 0, True, oldest_trained_version)
        statistics = group_statistics(groups, tensors, torch.zeros_like(tensors.behaviour_logprobs))
        honest, claimed = auditor.check(groups, statistics, tensors)

        assert honest.exact_diff_nats is not None and honest.exact_diff_nats < 1e-4
        assert honest.provenance is not None and not honest.provenance.failed
        assert honest.provenance.num_violations == 0
        if oldest_trained_version is None:
            assert claimed.exact_diff_nats is not None and claimed.exact_diff_nats > CONFIG.audit_tolerance_nats
        else:  # every token claimed too old to train: per_token admission would have dropped it, no audit
            assert claimed.exact_diff_nats is None
