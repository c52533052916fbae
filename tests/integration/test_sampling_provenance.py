"""Sampling provenance through the learner's spot audit (services/learner/provenance.py, audit.py) with a
real tiny model: an honest keyed group passes; the same tokens replayed under another task (log-probs
exact, so the log-prob check passes), a group sampled without the task's keys, and samples cherry-picked
among draws with other seeds fail; the failure costs the worker an audit failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engines.interface import Sampling
from engines.torch_engine import TorchEngine
from services.learner import trainer
from services.learner.audit import Auditor, ExactCheck
from services.learner.batch import AdmittedGroup, tensorize
from services.learner.grpo import token_logprobs
from services.learner.trust import TrustTracker, group_statistics
from services.rollout.rollout_groups import build_rollout_group
from shared.bus import Delivery
from shared.config import TrustConfig
from shared.keyed_sampling import task_seed
from shared.messages import RolloutGroup, ScoredGroup, TaskGroup

pytestmark = pytest.mark.integration

CONFIG = TrustConfig(audit_fraction=1.0, audit_keep_versions=2)
NUM_SAMPLES, MAX_NEW_TOKENS = 8, 6


def task(task_id: str) -> TaskGroup:
    return TaskGroup(
        run_id="r",
        task_id=task_id,
        task_name="arithmetic_mod10",
        prompt="3+4=",
        num_samples=NUM_SAMPLES,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=1.0,
    )


def sampled(engine: TorchEngine, task_id: str, worker_id: str, seed: int | None) -> ScoredGroup:
    """A group for `task_id` sampled with keyed seed `seed` (None: torch's own sampling)."""
    (samples,) = engine.generate(
        ["3+4="], Sampling(NUM_SAMPLES, MAX_NEW_TOKENS, 1.0), sampling_seeds=None if seed is None else [seed]
    )
    rollout = build_rollout_group(task(task_id), samples, worker_id, 0, 0.01)
    return ScoredGroup(run_id="r", rollout=rollout, rewards=[0.0] * NUM_SAMPLES)


def replayed(group: ScoredGroup, task_id: str, worker_id: str) -> ScoredGroup:
    """The same tokens and log-probs posted as the answer to another task of the same prompt."""
    rollout: RolloutGroup = group.rollout.model_copy(update={"task_id": task_id, "worker_id": worker_id})
    return group.model_copy(update={"rollout": rollout})


def audit(auditor: Auditor, tokenizer: Any, groups: list[ScoredGroup]) -> tuple[list[ExactCheck], TrustTracker]:
    model = auditor.policy
    admitted = [AdmittedGroup(Delivery("scored", "learner", f"{i}-0", g, 1), 0, False) for i, g in enumerate(groups)]
    tensors = tensorize(groups, tokenizer.pad_token_id or 0, True)
    with torch.no_grad():
        pi_prox = token_logprobs(model, tensors.input_ids, tensors.attention_mask, tensors.temperatures)
    statistics = group_statistics(admitted, tensors, pi_prox)
    checks = auditor.check(admitted, statistics, tensors)
    tracker = TrustTracker(CONFIG)
    for stat, check in zip(statistics, checks, strict=True):
        assert check.provenance is not None
        tracker.observe(
            stat.worker_id, stat.lag, stat.abs_diff_nats, check.exact_diff_nats, None, check.provenance.failed
        )
    return checks, tracker


def test_only_the_group_keyed_with_its_own_tasks_seed_passes(model_dir: Path) -> None:
    torch.manual_seed(0)
    model, tokenizer = trainer.load_policy(model_dir)
    auditor = Auditor(model, CONFIG, seed=0)
    auditor.remember(0, model)  # published before the groups are made
    engine = TorchEngine(model_dir)
    engine.load_state_dict(model.state_dict(), 0)  # the worker holds version 0
    honest = sampled(engine, "task-a", "w-honest", task_seed("task-a"))
    replay = replayed(honest, "task-b", "w-replay")  # same prompt, new task: new seed, old tokens
    unkeyed = sampled(engine, "task-c", "w-unkeyed", None)
    cherry = sampled(engine, "task-d", "w-cherry", task_seed("task-d") + 1_000)  # draws made with other seeds

    checks, tracker = audit(auditor, tokenizer, [honest, replay, unkeyed, cherry])

    honest_check, *liars = checks
    assert honest_check.provenance is not None and not honest_check.provenance.failed
    assert honest_check.provenance.num_violations == 0 and honest_check.provenance.max_gap < 1e-4
    assert honest_check.provenance.num_tokens == len(honest.rollout.completion_token_ids) // 4
    for check in liars:
        assert check.exact_diff_nats is not None and check.exact_diff_nats < 1e-4  # log-probs are exact
        assert check.provenance is not None and check.provenance.failed, check.provenance
    trust = tracker.snapshot()
    assert trust["w-honest"].num_provenance_checks == 1 and trust["w-honest"].num_provenance_failures == 0
    for worker_id in ("w-replay", "w-unkeyed", "w-cherry"):
        assert trust[worker_id].num_provenance_failures == 1 and trust[worker_id].num_audit_failures == 1
