"""Lying rollout workers (benchmarks/liars.py), one kind per run, next to two honest ones: the
learner's trust score catches the liar (docs/trust.md), the coordinator quarantines it, no honest worker
is quarantined, the liar's later groups are dropped with the reason `quarantined`, and every group is
accounted for. The detection delay (the liar's trained groups until its score crossed the threshold)
goes into the suite's results table."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from benchmarks.liars import FaultKind
from benchmarks.trust import liar_detection, quarantined_ids, worker_ids
from cluster.local import LocalCluster
from services.reward.decode import CompletionDecoder
from shared.api import StatusResponse, WorkerInfo, WorkerState
from shared.messages import RolloutGroup
from shared.run_records import read_trust_records
from shared.streams import DEAD, SCORED
from shared.tasks import make_task
from tests.faults.cluster_run import FaultRun, assert_nothing_lost, operator_bus
from tests.faults.conftest import FaultRunner

pytestmark = [pytest.mark.faults, pytest.mark.slow]

LIAR = "worker-2"
MAX_GROUPS_UNTIL_CAUGHT = 50  # the target detection delay, in the liar's trained groups


@pytest.mark.parametrize("kind", [FaultKind.GARBAGE_LOGPROBS, FaultKind.STALE_WEIGHTS, FaultKind.SWAPPED_TEXT])
def test_a_lying_worker_is_quarantined(
    fault_run: FaultRunner, kind: FaultKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: dict[str, Any] = {}
    # the check reads every scored group of the liar after the run: the services keep what they consumed
    monkeypatch.setenv("RL_TRIM_INTERVAL_S", str(24 * 3600))

    def check_the_liars_groups(cluster: LocalCluster, status: StatusResponse) -> None:
        names = {worker.worker_id: worker.name for worker in status.workers}
        checked.update(
            check_dead_letters_and_rewards(cluster, {wid for wid, name in names.items() if name == LIAR}, kind)
        )

    run = fault_run(liars={LIAR: kind}, inspect=check_the_liars_groups)

    ids = worker_ids(run.run_dir)  # worker id -> service name
    liar_ids = {worker_id for worker_id, name in ids.items() if name == LIAR}
    quarantined = set(quarantined_ids(run.run_dir))
    assert liar_ids & quarantined, f"the {kind} liar was never quarantined"
    assert quarantined <= liar_ids, f"honest workers quarantined: {quarantined - liar_ids}"
    assert any(worker.state == WorkerState.QUARANTINED for worker in run.workers_named(LIAR))
    assert all(worker.state != WorkerState.QUARANTINED for worker in honest_workers(run))

    records = read_trust_records(run.run_dir / "trust.jsonl")
    detection = liar_detection(records, liar_ids, run.cluster.run.trust.quarantine_score, kind)
    num_dropped_quarantined = run.accounting.num_dropped.get("quarantined", 0)
    run.row["liar"] = {"kind": kind.value, **detection, "num_dropped_quarantined": num_dropped_quarantined, **checked}
    # bench-trust's count: from the liar's first group (stale_weights: its first claiming a version past the freeze)
    assert detection["lying_groups_until_suspect"] is not None, detection
    assert detection["lying_groups_until_suspect"] <= MAX_GROUPS_UNTIL_CAUGHT, detection
    # After it turned suspect, at most the step being collected took its groups: quarantine stops its leases
    # (the work API gives a quarantined worker no tasks) and the learner drops what it had queued, which may
    # be nothing (num_dropped_quarantined is reported, not required).
    groups_per_step = run.cluster.run.grpo.groups_per_step
    assert detection["groups_trained_after_suspect"] <= groups_per_step, (detection, run.accounting.summary())
    assert_nothing_lost(run, num_dead_lettered=checked["num_dead_lettered_from_liar"])


def honest_workers(run: FaultRun) -> list[WorkerInfo]:
    return [worker for worker in run.final_status.workers if worker.name != LIAR and worker.name.startswith("worker")]


def check_dead_letters_and_rewards(cluster: LocalCluster, liar_ids: set[str], kind: FaultKind) -> dict[str, Any]:
    """Every dead letter is one of the liar's groups (swapped ids can break the rules of an honest
    engine's output: an EOS mid-sample); for swapped_text, every group of the liar that was scored got
    the reward of the text its token ids decode to, not of the text it sent."""
    bus = operator_bus(cluster)
    try:
        letters = bus.entries(DEAD)
        from_liar = [letter for letter in letters if RolloutGroup.decode(letter.payload).worker_id in liar_ids]
        assert len(from_liar) == len(letters), [letter.error for letter in letters]
        if kind != FaultKind.SWAPPED_TEXT:
            assert not letters, [letter.error for letter in letters]
            return {"num_dead_lettered_from_liar": 0}
        reasons = Counter(re.sub(r"sample \d+ ", "a sample ", letter.error) for letter in letters)
        scored = [group for group in bus.entries(SCORED) if group.rollout.worker_id in liar_ids]
    finally:
        bus.redis.close()
    decoder = CompletionDecoder(cluster.model_dir, cluster.run.grpo.max_new_tokens)
    task = make_task(
        cluster.run.task.name, num_eval_prompts=cluster.run.task.num_eval_prompts, seed=cluster.run.task.seed
    )
    reference = {prompt.prompt: prompt.reference for prompt in task.all_prompts()}
    num_texts_swapped = 0
    for group in scored:
        decoded = decoder.decode(group.rollout)
        assert group.rewards == [task.score(text, reference[group.rollout.prompt]) for text in decoded]
        num_texts_swapped += sum(
            text != claimed for text, claimed in zip(decoded, group.rollout.completion_texts, strict=True)
        )
    assert scored and num_texts_swapped > 0  # it did lie, and its lie was not what got scored
    return {
        "num_dead_lettered_from_liar": len(from_liar),
        "dead_letter_reasons": dict(reasons),
        "num_scored_from_liar": len(scored),
        "num_samples_text_not_ids": num_texts_swapped,
    }
