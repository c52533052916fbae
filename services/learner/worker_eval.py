"""The learner's side of held-out evaluation by the rollout workers (docs/evaluation.md#where-evaluation-runs).

    route       where version t is evaluated: the workers, unless `[learner] eval_on = "learner"`, the task is
                multi-turn, or no worker is active now (the coordinator's registry in Redis); then the learner's
                own eval thread (evaluator.py), and the learner logs why
    request     an EvalRequest on `eval_requests`: the reward service puts one eval task per held-out prompt on
                `eval_tasks:<t>`, which the coordinator leases only to workers whose engine holds exactly t. An
                eval point's request goes out one step ahead (after step t - 1), so its tasks wait for the
                workers before version t reaches them: a worker holds each version for about one step
    collect     the workers' finished evaluations, read from `eval_scores` without blocking (once per step): each
                becomes the version's EvalRecord, evaluated_by "workers", eval_s from version t's eval point (its
                request, or the step that reached t when requested ahead) to its last score, eval_stall_s 0
    overdue     a request not complete `deadline_s` after it was made ([broadcast] version_timeout_s: the time a
                version may take to reach a worker): dropped, and the learner's evaluator evaluates the weights it
                holds then (a request for the version it holds then aside), with a warning saying why

The learner's step never waits for any of it; the final evaluation (Learner.finish) does, at most until its
deadline, so "after" is the final weights' accuracy either way. Requests live in this process only: a learner
restarted from a checkpoint waits for none made before (their scores, when they come, match no open request
and are dropped; the reward service abandons their tasks at their deadline, or when the new learner asks for
the same version again).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from services.learner.batch import LEARNER_CONSUMER
from services.learner.evaluate import describe_eval, summarize_eval
from shared.bus import StreamBus, redis_text
from shared.config import RunConfig
from shared.messages import EvalRequest, EvalScores
from shared.retry import call_with_retry
from shared.run_records import EvalRecord, RunTotals
from shared.streams import EVAL_REQUESTS, EVAL_SCORES
from shared.tasks import TaskAdapter
from shared.tasks.environment import EnvironmentTask

log = logging.getLogger(__name__)

READ_BLOCK_MS = 1  # a look, not a wait (XREADGROUP BLOCK 0 would wait forever)
MAX_WAIT_BLOCK_MS = 500  # the final evaluation's wait reads in blocks of at most this


@dataclass
class OpenRequest:
    policy_version: int
    requested_at_s: float  # unix
    deadline_at_s: float  # monotonic
    started_at_s: float | None = None  # unix: when the learner reached the version (None: not yet)


class WorkerEvals:
    """Requests, collects and times out the workers' evaluations of one learner process (module doc)."""

    def __init__(
        self,
        bus: StreamBus,
        run: RunConfig,
        task: TaskAdapter,
        *,
        deadline_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.run = run
        self.task = task
        self.deadline_s = deadline_s
        self.monotonic = monotonic
        self.open: dict[str, OpenRequest] = {}  # by request id
        self.unsynced: list[EvalRecord] = []  # in metrics.jsonl, not yet in the totals (Learner.add_worker_evals)
        self.last_learner_version: int | None = None  # the last version the learner's evaluator took
        self.recorded: set[int] = set()  # versions the workers' evaluations recorded (this process)
        self._group_ready = False

    # where
    def route(self, *, published: bool) -> str | None:
        """Why a version goes to the learner's evaluator now (None: to the workers). `published`: the version is
        (or will be) announced to the workers; a version that is not (publish_every) cannot reach them."""
        if self.run.learner.eval_on == "learner":
            return '[learner] eval_on = "learner"'
        if isinstance(self.task, EnvironmentTask):
            return "multi-turn tasks are evaluated by the learner"
        if not published:
            return "the version is not published to the workers ([schedule] publish_every)"
        if call_with_retry(self.num_active_workers, "count active workers") == 0:
            return "no rollout worker is active"
        return None

    def num_active_workers(self) -> int:
        """Workers whose lease is running and whose state is active (the coordinator's registry)."""
        keys, now_s = self.bus.keys, time.time()
        worker_ids = self.bus.redis.zrangebyscore(keys.worker_leases, f"({now_s!r}", "+inf")
        with self.bus.redis.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hget(keys.worker(redis_text(worker_id)), "state")
            states = pipe.execute()
        return sum(1 for state in states if state is not None and redis_text(state) == "active")

    # requests
    def request(self, policy_version: int, *, reached: bool) -> None:
        """Ask the workers to evaluate `policy_version`; `reached`: the learner holds it now (else: ahead)."""
        self.ensure_group()
        request = EvalRequest(
            run_id=self.run.run_id,
            request_id=uuid.uuid4().hex,
            policy_version=policy_version,
            deadline_s=self.deadline_s,
        )
        call_with_retry(lambda: self.bus.publish(EVAL_REQUESTS, request), "request an evaluation")
        self.open[request.request_id] = OpenRequest(
            policy_version,
            requested_at_s=request.requested_at_s,
            deadline_at_s=self.monotonic() + self.deadline_s,
            started_at_s=request.requested_at_s if reached else None,
        )
        log.info("eval at version %d requested from the workers%s", policy_version, "" if reached else " (ahead)")

    def is_open(self, policy_version: int) -> bool:
        return any(request.policy_version == policy_version for request in self.open.values())

    def covers(self, policy_version: int) -> bool:
        """The version is requested from the workers, recorded from them, or taken by the learner's evaluator."""
        return (
            self.is_open(policy_version)
            or policy_version in self.recorded
            or self.last_learner_version == policy_version
        )

    def reached(self, policy_version: int) -> None:
        """The learner holds `policy_version` now: its requested evaluation's eval_s starts here."""
        for request in self.open.values():
            if request.policy_version == policy_version and request.started_at_s is None:
                request.started_at_s = time.time()

    # results
    def take_finished(self, wall_s: float, block_ms: int = READ_BLOCK_MS) -> list[EvalRecord]:
        """Records of the open requests the workers finished (waiting at most `block_ms` for one); scores of
        requests not open here (made before a restart, or dropped as overdue) are acked and dropped. Nothing
        open: nothing read (what comes meanwhile waits for the next request's reads)."""
        if not self.open:
            return []
        self.ensure_group()
        deliveries = call_with_retry(
            lambda: self.bus.read(EVAL_SCORES, LEARNER_CONSUMER, count=16, block_ms=block_ms), "read eval scores"
        )
        records = []
        for delivery in deliveries:
            request = self.open.pop(delivery.message.request_id, None)
            if request is None:
                log.info("scores of version %d came for no open request: dropped", delivery.message.policy_version)
            else:
                records.append(self.record_of(delivery.message, request, wall_s))
                self.recorded.add(request.policy_version)
        if deliveries:
            call_with_retry(lambda: self.bus.ack(EVAL_SCORES, [d.message_id for d in deliveries]), "ack eval scores")
        self.unsynced += records
        return records

    def record_of(self, scores: EvalScores, request: OpenRequest, wall_s: float) -> EvalRecord:
        result = summarize_eval(
            self.task,
            [score.completion_text for score in scores.scores],
            [score.reward for score in scores.scores],
            sum(score.verifier_failed for score in scores.scores),
        )
        started_at_s = request.started_at_s if request.started_at_s is not None else request.requested_at_s
        record = result.record(
            self.task,
            eval_step=scores.policy_version,
            eval_s=max(0.0, scores.finished_at_s - started_at_s),
            eval_stall_s=0.0,
            wall_s=wall_s,
            evaluated_by="workers",
        )
        num_workers = len({score.worker_id for score in scores.scores})
        log.info(
            "eval at version %d: %s (by %d workers, %.2fs from its eval point)",
            scores.policy_version,
            describe_eval(record),
            num_workers,
            record.eval_s,
        )
        return record

    def take_overdue(self) -> list[int]:
        """Versions whose request passed its deadline unanswered (dropped from the open requests)."""
        now_s = self.monotonic()
        overdue = [request_id for request_id, request in self.open.items() if now_s >= request.deadline_at_s]
        return sorted(self.open.pop(request_id).policy_version for request_id in overdue)

    def wait(self, up_to_version: int, wall_s: Callable[[], float]) -> tuple[list[EvalRecord], list[int]]:
        """Block until every open request of a version up to `up_to_version` is finished or overdue: (the records,
        the overdue versions). Requests made ahead for later versions are left open."""
        records: list[EvalRecord] = []
        overdue: list[int] = []
        while waiting := [r for r in self.open.values() if r.policy_version <= up_to_version]:
            left_s = min(request.deadline_at_s for request in waiting) - self.monotonic()
            block_ms = int(min(max(left_s * 1000, 1), MAX_WAIT_BLOCK_MS))
            records += self.take_finished(wall_s(), block_ms=block_ms)
            overdue += [v for v in self.take_overdue() if v <= up_to_version]
        return records, overdue

    def take_unsynced(self) -> list[EvalRecord]:
        """The records not yet in the totals, oldest version first."""
        unsynced, self.unsynced = sorted(self.unsynced, key=lambda record: record.eval_step), []
        return unsynced

    def ensure_group(self) -> None:
        if not self._group_ready:
            call_with_retry(lambda: self.bus.ensure_group(EVAL_SCORES), "create the eval scores group")
            self._group_ready = True


def add_to_totals(totals: RunTotals, record: EvalRecord) -> None:
    """RunTotals.add_eval, in version order: a record older than the last one added only sets `before` (step 0)."""
    if totals.eval_step_last is None or record.eval_step >= totals.eval_step_last:
        totals.add_eval(record)
    elif record.eval_step == 0:
        totals.eval_accuracy_before = record.eval_accuracy
