"""The learner's side of held-out evaluation by the workers (services/learner/worker_eval.py): the real learner
against real Redis, fed by the stand-in worker of test_learner_loop.py, with a registered active worker in the
coordinator's registry and, in place of the reward service, a thread that answers some EvalRequests with
EvalScores. An answered version's record says evaluated_by "workers", with the scores' accuracy; a version
nobody answers is past its deadline at the end, and the learner's own evaluator evaluates the final weights
instead, so "after" is still the final policy's. Also: where the learner routes an evaluation, and a request
made before a restart waited on by nobody."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cluster.redis_server import RedisServer
from services.learner.learner import Learner
from services.learner.worker_eval import WorkerEvals, add_to_totals
from shared.bus import StreamBus
from shared.config import BroadcastConfig, LearnerConfig, RunConfig, ScheduleConfig
from shared.keys import RunKeys
from shared.messages import EvalScore, EvalScores
from shared.run_records import EvalRecord, RunTotals
from shared.streams import EVAL_REQUESTS, EVAL_SCORES
from shared.tasks import build_task
from tests.integration.test_learner_loop import StandInWorker, learner_settings, read_metrics, small_run

pytestmark = pytest.mark.integration


def register_active_worker(bus: StreamBus, worker_id: str = "w-fake") -> None:
    """What the coordinator's registry holds for a live, active worker (services/coordinator/worker_registry.py)."""
    bus.redis.zadd(bus.keys.worker_leases, {worker_id: time.time() + 3600})
    bus.redis.hset(bus.keys.worker(worker_id), "state", "active")


class Responder(threading.Thread):
    """Stands in for the reward service and the workers: answers the EvalRequests of `versions`, every held-out
    prompt right (its reference as the completion)."""

    def __init__(self, bus: StreamBus, run: RunConfig, versions: set[int]) -> None:
        super().__init__(daemon=True)
        self.bus, self.run_config, self.versions = bus, run, versions
        self.task = build_task(run.task)
        self.stop_event = threading.Event()
        self.requested: list[int] = []

    def run(self) -> None:
        self.bus.ensure_group(EVAL_REQUESTS)
        while not self.stop_event.is_set():
            for delivery in self.bus.read(EVAL_REQUESTS, "responder", count=8, block_ms=20):
                request = delivery.message
                self.requested.append(request.policy_version)
                if request.policy_version in self.versions:
                    scores = [
                        EvalScore(
                            prompt_index=i,
                            completion_text=item.reference,
                            reward=1.0,
                            verifier_failed=False,
                            worker_id="w-fake",
                        )
                        for i, item in enumerate(self.task.eval_set)
                    ]
                    self.bus.publish(
                        EVAL_SCORES,
                        EvalScores(
                            run_id=request.run_id,
                            request_id=request.request_id,
                            policy_version=request.policy_version,
                            requested_at_s=request.requested_at_s,
                            first_leased_at_s=None,
                            finished_at_s=time.time(),
                            scores=scores,
                        ),
                    )
                self.bus.ack(EVAL_REQUESTS, [delivery.message_id])


def test_answered_versions_are_the_workers_and_an_unanswered_final_one_falls_back_to_the_learner(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    run = small_run(keys.run_id, num_steps=4).model_copy(
        update={
            "schedule": ScheduleConfig(
                staleness_bound=1, num_steps=4, checkpoint_every=2, eval_every=2, max_wall_s=120
            ),
            "broadcast": BroadcastConfig(chunk_size_bytes=65536, delta=False, version_timeout_s=1.5),  # the deadline
        }
    )
    register_active_worker(bus)
    responder = Responder(bus, run, versions={0})
    worker = StandInWorker(bus, run, tiny_policy_dir)
    responder.start()
    worker.start()
    try:
        with Learner(run, learner_settings(redis_server.url, tmp_path, tiny_policy_dir), bus) as learner:
            summary = learner.run()
    finally:
        worker.stop_event.set()
        responder.stop_event.set()
        worker.join(timeout=10)
        responder.join(timeout=10)

    _, evals = read_metrics(tmp_path)
    by_version = {record["eval_step"]: record for record in evals}
    assert len(by_version) == len(evals)  # no version recorded twice
    assert by_version[0]["evaluated_by"] == "workers" and by_version[0]["eval_accuracy"] == 1.0
    assert by_version[0]["eval_stall_s"] == 0.0 and by_version[0]["num_eval_prompts"] == run.task.num_eval_prompts
    assert by_version[4]["evaluated_by"] == "learner"  # nobody answered 4: the final weights, on the learner
    assert 2 not in by_version or by_version[2]["evaluated_by"] == "learner"
    assert {0, 2, 4} <= set(responder.requested)  # 2 and 4 were asked for (ahead), then fell back
    assert summary.eval_accuracy_before == 1.0 and summary.totals.eval_step_last == 4
    assert summary.eval_accuracy_after == by_version[4]["eval_accuracy"]


def test_the_learner_routes_evaluations_and_drops_what_it_did_not_ask_for(bus: StreamBus, keys: RunKeys) -> None:
    run = RunConfig(run_id=keys.run_id)
    task = build_task(run.task)
    evals = WorkerEvals(bus, run, task, deadline_s=0.2)
    assert evals.route(published=True) == "no rollout worker is active"
    register_active_worker(bus)
    assert evals.route(published=True) is None
    assert "publish_every" in (evals.route(published=False) or "")
    on_learner = WorkerEvals(
        bus, run.model_copy(update={"learner": LearnerConfig(eval_on="learner")}), task, deadline_s=1
    )
    assert on_learner.route(published=True) == '[learner] eval_on = "learner"'

    evals.request(5, reached=True)
    (request,) = bus.entries(EVAL_REQUESTS)
    assert request.policy_version == 5 and request.deadline_s == 0.2
    # scores of a request made by another learner process (before a restart): acked and dropped
    stale = EvalScore(prompt_index=0, completion_text="1", reward=1.0, verifier_failed=False, worker_id="w")
    scores = [stale.model_copy(update={"prompt_index": i}) for i in range(len(task.eval_set))]
    bus.publish(
        EVAL_SCORES,
        EvalScores(
            run_id=keys.run_id,
            request_id="before-the-restart",
            policy_version=5,
            requested_at_s=time.time(),
            first_leased_at_s=None,
            finished_at_s=time.time(),
            scores=scores,
        ),
    )
    assert evals.take_finished(wall_s=1.0, block_ms=100) == []
    assert bus.group_progress(EVAL_SCORES) == (0, 0)
    records, overdue = evals.wait(5, lambda: 1.0)  # nobody answers: back once the deadline passed
    assert (records, overdue) == ([], [5]) and not evals.open


def test_worker_records_join_the_totals_in_version_order() -> None:
    def record(step: int, accuracy: float) -> EvalRecord:
        return EvalRecord(
            eval_step=step,
            eval_accuracy=accuracy,
            eval_reward_mean=accuracy,
            num_eval_prompts=1,
            eval_s=0.1,
            wall_s=1.0,
        )

    totals = RunTotals()
    for step, accuracy in ((4, 0.4), (0, 0.1), (2, 0.2)):  # a late record of an older version
        add_to_totals(totals, record(step, accuracy))
    assert (totals.eval_accuracy_before, totals.eval_accuracy_last, totals.eval_step_last) == (0.1, 0.4, 4)
