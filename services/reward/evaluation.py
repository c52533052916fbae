"""Held-out evaluation by the workers, the data plane's side (docs/evaluation.md#where-evaluation-runs).

One turn (`WorkerEvaluations.serve_once`, called by the service's loop after its rollouts), the table of contents:

    receive requests  EvalRequests from the learner: for version v, one eval task per held-out prompt on
                      `eval_tasks:<v>` (one sample, greedy, min_policy_version = eval_version = v), its
                      reference and prompt kept here as a training task's are; the version's state in Redis
                      (RunKeys.eval_state, eval_prompts, evals_open) and the request's ack in one transaction.
                      A second request for an open v (a learner restarted from a checkpoint) replaces the first
    receive answers   eval groups the work API accepted (it leases them only to workers at exactly v and checks
                      each answer: services/coordinator/eval_leases.py), from `eval_rollouts`
    score             the producer check, then the rollouts' path (services/reward/scoring.py: task, reference,
                      prompt ids, completion ids, decode, the verifier in its child process). A verifier that fails
                      scores the prompt 0, counted (as the learner's own evaluation does); a forged or invalid
                      group is dead-lettered and its prompt issued again. The first score of each prompt is kept
                      (RunKeys.eval_scores), written with the answer's ack
    publish           once every prompt of v is scored: one EvalScores on `eval_scores`, and v's streams and keys
                      deleted, in one transaction
    abandon           a version past its request's deadline: its streams and keys deleted, nothing published (the
                      learner has evaluated with its own evaluator meanwhile: services/learner/worker_eval.py)

Eval groups never enter `rollouts` or `scored`, the task feed's in-flight count (task_feed.py) or the run's
accounting (reward:counts, reward:worker:<id>): evaluation is measured, never trained. Multi-turn tasks are not
evaluated here (the learner keeps those on its own evaluator).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import cast

from redis.client import Pipeline
from redis.typing import EncodableT

from services.reward.decode import InvalidTokensError
from services.reward.provenance import ForgedRolloutError, ProducerCheck
from services.reward.scoring import GroupScorer, UnscorableGroupError
from shared.bus import PAYLOAD_FIELD, Delivery, StreamBus, redis_text
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import EvalRequest, EvalScore, EvalScores, RolloutGroup, TaskGroup
from shared.streams import EVAL_REQUESTS, EVAL_ROLLOUTS, EVAL_SCORES, eval_tasks
from shared.tasks import TaskAdapter
from shared.tasks.environment import EnvironmentTask
from shared.verifier_pool import VerifierFailedError

log = logging.getLogger(__name__)

READ_BLOCK_MS = 1  # the service's loop blocks on `rollouts`; these reads only look (BLOCK 0 would wait forever)
BAD_GROUP_ERRORS = (ForgedRolloutError, UnscorableGroupError, InvalidTokensError)


class WorkerEvaluations:
    """Issues, scores and publishes the workers' evaluations of one run (module doc)."""

    def __init__(
        self,
        bus: StreamBus,
        task: TaskAdapter,
        run: RunConfig,
        scorer: GroupScorer,
        producers: ProducerCheck,
        *,
        reference_ttl_s: int,
        consumer_name: str,
        claim_idle_ms: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.keys: RunKeys = bus.keys
        self.task = task
        self.run = run
        self.scorer = scorer
        self.producers = producers
        self.reference_ttl_s = reference_ttl_s
        self.consumer_name = consumer_name
        self.claim_idle_ms = claim_idle_ms
        self.clock = clock
        self.open: dict[int, float] = {}  # version -> unix time its evaluation is abandoned
        self.num_scored = 0  # eval groups scored (verifier failures included)
        self.num_published = 0  # versions whose scores went to the learner
        self.num_abandoned = 0

    def start(self) -> None:
        """Create the groups (before anything is produced on them) and take over the versions left open."""
        for stream in (EVAL_REQUESTS, EVAL_ROLLOUTS, EVAL_SCORES):
            self.bus.ensure_group(stream)
        self.load_open()
        self.score(self.bus.read_own_pending(EVAL_ROLLOUTS, self.consumer_name))

    def serve_once(self) -> None:
        """One turn: requests -> tasks; answers -> scores; complete versions -> the learner; overdue ones dropped."""
        for request in self.bus.read(EVAL_REQUESTS, self.consumer_name, count=8, block_ms=READ_BLOCK_MS):
            self.issue(request)
        if self.open:
            claimed = self.bus.claim_stale(EVAL_ROLLOUTS, self.consumer_name, min_idle_ms=self.claim_idle_ms, count=64)
            self.score(claimed or self.bus.read(EVAL_ROLLOUTS, self.consumer_name, count=64, block_ms=READ_BLOCK_MS))
            self.abandon_overdue()

    def load_open(self) -> None:
        """The versions whose evaluation is open, as Redis holds them (another instance may have opened one)."""
        raw = cast(dict[bytes, bytes], self.bus.redis.hgetall(self.keys.evals_open))
        self.open = {int(version): float(deadline) for version, deadline in raw.items()}

    # requests
    def issue(self, delivery: Delivery[EvalRequest]) -> None:
        """The request's eval tasks, state and ack in one transaction (a stale or unservable request: acked only)."""
        request = delivery.message
        version = request.policy_version
        deadline_at_s = request.requested_at_s + request.deadline_s
        why_not = self.unservable(request, deadline_at_s)
        if why_not is not None:
            log.warning("eval request for version %d not served: %s", version, why_not)
            self.bus.ack(EVAL_REQUESTS, [delivery.message_id])
            return
        if version in self.open:
            self.close(version, "a newer request for the same version replaced it")
        tasks = [self.eval_task(version, index) for index in range(len(self.task.eval_set))]
        stream = self.keys.name_of(eval_tasks(version))
        with self.bus.redis.pipeline(transaction=True) as pipe:
            for index, task in enumerate(tasks):
                self.keep_reference(pipe, task, index)
            pipe.xgroup_create(stream, cast(str, eval_tasks(version).group), id="0", mkstream=True)
            for task in tasks:
                pipe.xadd(stream, {PAYLOAD_FIELD: task.encode()})
            pipe.hset(self.keys.eval_prompts(version), mapping={task.task_id: i for i, task in enumerate(tasks)})
            state: dict[EncodableT, EncodableT] = {"request_id": request.request_id, "num_prompts": len(tasks)}
            state |= {"requested_at_s": repr(request.requested_at_s), "deadline_at_s": repr(deadline_at_s)}
            pipe.hset(self.keys.eval_state(version), mapping=state)
            pipe.hset(self.keys.evals_open, str(version), repr(deadline_at_s))
            pipe.xack(delivery.stream, delivery.group, delivery.message_id)
            pipe.execute()
        self.open[version] = deadline_at_s
        log.info("issued %d eval tasks of version %d (request %s)", len(tasks), version, request.request_id)

    def unservable(self, request: EvalRequest, deadline_at_s: float) -> str | None:
        if request.run_id != self.run.run_id:
            return f"it is run {request.run_id!r}'s"
        if isinstance(self.task, EnvironmentTask):
            return "multi-turn tasks are evaluated by the learner"
        if deadline_at_s <= self.clock():
            return "its deadline has passed"
        return None

    def eval_task(self, version: int, index: int) -> TaskGroup:
        item = self.task.eval_set[index]
        return TaskGroup(
            run_id=self.run.run_id,
            task_id=uuid.uuid4().hex,
            task_name=self.task.name,
            prompt=item.prompt,
            messages=list(item.messages),
            num_samples=1,
            max_new_tokens=self.run.grpo.max_new_tokens,
            temperature=self.run.grpo.temperature,  # greedy decoding; log-probs at the run's temperature
            min_policy_version=version,
            eval_version=version,
        )

    def keep_reference(self, pipe: Pipeline, task: TaskGroup, index: int) -> None:
        """The verifier's reference (and a raw-text prompt, which the prompt ids must encode), kept here only."""
        item = self.task.eval_set[index]
        pipe.set(self.keys.task_reference(task.task_id), item.reference.encode(), ex=self.reference_ttl_s)
        if not item.messages:
            pipe.set(self.keys.task_prompt(task.task_id), item.prompt.encode(), ex=self.reference_ttl_s)

    # answers
    def score(self, deliveries: list[Delivery[RolloutGroup]]) -> None:
        touched: set[int] = set()
        if any(delivery.message.policy_version not in self.open for delivery in deliveries):
            self.load_open()
        for delivery in deliveries:
            group = delivery.message
            version = group.policy_version
            index = self.prompt_index(version, group.task_id)
            if version not in self.open or index is None:  # its evaluation is over (complete or abandoned)
                log.info("eval group of version %d for task %s came after its evaluation ended", version, group.task_id)
                self.bus.ack(EVAL_ROLLOUTS, [delivery.message_id])
                continue
            try:
                self.producers.verify(group)
                score = self.score_group(group, index)
            except BAD_GROUP_ERRORS as exc:  # policy: dead-lettered, and the prompt asked again
                self.bus.dead_letter(delivery, str(exc))
                self.reissue(version, index)
                continue
            with self.bus.redis.pipeline(transaction=True) as pipe:
                pipe.hsetnx(self.keys.eval_scores(version), str(index), score.model_dump_json())
                pipe.xack(delivery.stream, delivery.group, delivery.message_id)
                pipe.delete(self.keys.task_reference(group.task_id), self.keys.task_prompt(group.task_id))
                pipe.execute()
            self.num_scored += 1
            touched.add(version)
        for version in sorted(touched):
            self.publish_if_complete(version)

    def score_group(self, group: RolloutGroup, index: int) -> EvalScore:
        """The group's one sample scored as a training group's samples are; a failed verifier scores 0."""
        try:
            (reward,) = self.scorer.check_and_score(group, self.bus.redis, self.keys).rewards
            verifier_failed = False
        except VerifierFailedError as exc:  # policy: the prompt counts as wrong (services/learner/evaluate.py)
            log.warning("held-out prompt %d of version %d scored 0: %s", index, group.policy_version, exc)
            reward, verifier_failed = 0.0, True
        (text,) = self.scorer.decoder.decode(group)
        return EvalScore(
            prompt_index=index,
            completion_text=text,
            reward=reward,
            verifier_failed=verifier_failed,
            worker_id=group.worker_id,
        )

    def prompt_index(self, version: int, task_id: str) -> int | None:
        raw = self.bus.redis.hget(self.keys.eval_prompts(version), task_id)
        return None if raw is None else int(redis_text(raw))

    def reissue(self, version: int, index: int) -> None:
        """A new eval task for prompt `index` of `version` (its answer was dead-lettered)."""
        task = self.eval_task(version, index)
        with self.bus.redis.pipeline(transaction=True) as pipe:
            self.keep_reference(pipe, task, index)
            pipe.xadd(self.keys.name_of(eval_tasks(version)), {PAYLOAD_FIELD: task.encode()})
            pipe.hset(self.keys.eval_prompts(version), task.task_id, index)
            pipe.execute()

    # the end of a version's evaluation
    def publish_if_complete(self, version: int) -> None:
        state = {redis_text(k): redis_text(v) for k, v in self.bus.redis.hgetall(self.keys.eval_state(version)).items()}
        raw_scores = cast(dict[bytes, bytes], self.bus.redis.hgetall(self.keys.eval_scores(version)))
        if not state or len(raw_scores) < int(state["num_prompts"]):
            return
        scores = sorted(
            (EvalScore.model_validate_json(raw) for raw in raw_scores.values()), key=lambda s: s.prompt_index
        )
        first_leased_at_s = state.get("first_leased_at_s")
        message = EvalScores(
            run_id=self.run.run_id,
            request_id=state["request_id"],
            policy_version=version,
            requested_at_s=float(state["requested_at_s"]),
            first_leased_at_s=float(first_leased_at_s) if first_leased_at_s is not None else None,
            finished_at_s=self.clock(),
            scores=scores,
        )
        self.close(version, None, published=message)
        self.num_published += 1
        log.info("evaluation of version %d by the workers complete: %d prompts", version, len(scores))

    def abandon_overdue(self) -> None:
        now_s = self.clock()
        for version, deadline_at_s in list(self.open.items()):
            if now_s >= deadline_at_s:
                num_scored = int(self.bus.redis.hlen(self.keys.eval_scores(version)))
                self.close(version, f"{num_scored} of {len(self.task.eval_set)} prompts scored by its deadline")
                self.num_abandoned += 1

    def close(self, version: int, why: str | None, published: EvalScores | None = None) -> None:
        """Delete the version's eval stream and keys (and the references of its unanswered tasks); with
        `published`, its scores go to the learner in the same transaction."""
        task_ids = [redis_text(task_id) for task_id in self.bus.redis.hkeys(self.keys.eval_prompts(version))]
        k = self.keys
        with self.bus.redis.pipeline(transaction=True) as pipe:
            if published is not None:
                pipe.xadd(k.name_of(EVAL_SCORES), {PAYLOAD_FIELD: published.encode()})
            pipe.delete(k.name_of(eval_tasks(version)), k.eval_state(version), k.eval_prompts(version))
            pipe.delete(k.eval_scores(version))
            for task_id in task_ids:
                pipe.delete(k.task_reference(task_id), k.task_prompt(task_id))
            pipe.hdel(k.evals_open, str(version))
            pipe.execute()
        self.open.pop(version, None)
        if why is not None:
            log.warning("evaluation of version %d by the workers abandoned: %s", version, why)
