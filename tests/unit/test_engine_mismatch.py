"""The per-worker engine mismatch: behaviour vs recomputed log-probs over lag-0 tokens only, into the
step record, the learner state (round trip through msgpack) and Prometheus."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.learner.batch import AdmittedGroup, tensorize
from services.learner.mismatch import engine_mismatch
from shared.bus import Delivery
from shared.messages import LearnerState, RolloutGroup, ScoredGroup, WorkerMismatch, pack_float32, pack_int32
from shared.metrics import CallbackCollector, learner_families, new_registry
from shared.run_records import StepRecord, read_metrics
from tests.run_records import learner_state


def admitted(worker_id: str, staleness: int, completions: list[list[int]], logprobs: list[float]) -> AdmittedGroup:
    flat = [token for completion in completions for token in completion]
    rollout = RolloutGroup(
        run_id="r",
        group_id="g",
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="p",
        worker_id=worker_id,
        policy_version=5 - staleness,
        temperature=1.0,
        prompt_token_ids=pack_int32([3, 4]),
        completion_token_ids=pack_int32(flat),
        completion_lengths=pack_int32([len(c) for c in completions]),
        behaviour_logprobs=pack_float32(logprobs),
        completion_texts=["x"] * len(completions),
        finish_reasons=["stop"] * len(completions),
        generation_s=0.0,
    )
    group = ScoredGroup(run_id="r", rollout=rollout, rewards=[0.0] * len(completions))
    return AdmittedGroup(Delivery("scored", "learners", "1-0", group, 1), staleness, replayed=False)


def test_mismatch_is_per_worker_over_lag_0_completion_tokens_only() -> None:
    groups = [
        admitted("a", 0, [[5, 6], [7]], [-1.0, -2.0, -0.5]),
        admitted("b", 1, [[5]], [-9.0]),  # stale: its gap is staleness, not engine mismatch
        admitted("a", 0, [[8]], [-1.5]),
        admitted("c", 0, [[9, 9]], [-0.25, -0.25]),
    ]
    tensors = tensorize([g.group for g in groups], 0, normalize_advantage_by_std=True)
    # The learner's recomputation: behaviour + a known gap on completion tokens, garbage elsewhere.
    gaps = torch.tensor([[0.0, 0.1, -0.2], [0.0, 0.3, 0.0], [0.0, 5.0, 0.0], [0.0, -0.4, 0.0], [0.0, 0.0, 0.0]])
    recomputed = torch.where(tensors.completion_mask, tensors.behaviour_logprobs + gaps, torch.tensor(7.0))

    mismatch = engine_mismatch(groups, tensors, recomputed)

    assert sorted(mismatch) == ["a", "c"]
    a_gaps = [0.1, -0.2, 0.3, -0.4]
    assert mismatch["a"].num_tokens == 4
    assert mismatch["a"].logprob_abs_diff_mean == pytest.approx(sum(abs(g) for g in a_gaps) / 4, rel=1e-5)
    assert mismatch["a"].kl_k3 == pytest.approx(sum(math.exp(g) - 1 - g for g in a_gaps) / 4, rel=1e-4)
    assert mismatch["c"] == WorkerMismatch(num_tokens=2, logprob_abs_diff_mean=0.0, kl_k3=0.0)


def test_mismatch_travels_in_the_step_record_the_learner_state_and_prometheus(tmp_path: Path) -> None:
    mismatch = {"w-1": WorkerMismatch(num_tokens=10, logprob_abs_diff_mean=0.02, kl_k3=0.0003)}
    state = learner_state(
        num_steps_target=10,
        mismatch_by_worker=mismatch,
    )
    assert LearnerState.decode(state.encode()) == state
    record = StepRecord(
        step=1,
        policy_version=1,
        train_s=0.1,
        idle_s=0.0,
        publish_s=0.0,
        reward_mean=0.5,
        reward_std=0.1,
        staleness_histogram={"0": 1},
        max_staleness=0,
        num_dropped={},
        num_dead_lettered=0,
        num_groups=1,
        num_samples=8,
        num_tokens=10,
        num_replayed_groups=0,
        loss=0.0,
        ratio_mean=1.0,
        clip_fraction=0.0,
        truncated_fraction=0.0,
        approx_kl=0.0,
        grad_norm=0.1,
        wall_s=1.0,
        mismatch_by_worker=mismatch,
    )
    (tmp_path / "metrics.jsonl").write_text(record.model_dump_json() + "\n")
    assert read_metrics(tmp_path / "metrics.jsonl")[0] == [record]

    text = generate_latest(new_registry(CallbackCollector(lambda: learner_families(state)))).decode()
    families = {family.name: family.samples for family in text_string_to_metric_families(text)}
    (abs_diff,) = families["relayrl_learner_engine_mismatch_logprob_abs_diff"]
    assert abs_diff.labels == {"worker": "w-1"} and abs_diff.value == 0.02
    assert families["relayrl_learner_engine_mismatch_kl"][0].value == 0.0003
