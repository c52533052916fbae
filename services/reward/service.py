"""The reward service: feeds prompts to the rollout workers and scores what comes back.

Loop: trim what was consumed -> top up tasks -> receive rollouts -> verify the producer -> score ->
publish scored -> ack -> the workers' held-out evaluations (services/reward/evaluation.py: eval tasks out,
eval groups scored the same way, each version's scores to the learner; never on the training path). A rollout is acked only after its scored group is in Redis (and counted with it:
RunKeys.reward_counts, as each task issued is, and its reward per worker: shared/worker_rewards.py); a rollout that cannot be scored is
dead-lettered with the reason and the service keeps running; so is one not signed by the worker it
names (services/reward/provenance.py). Scoring decodes the token ids the learner trains on (never the
worker's text) and runs the verifier in a child process under a hard timeout
(services/reward/scoring.py). A Redis outage is waited out with backoff: what was read but not acked
stays pending and is claimed again after the outage. So is a Redis at `maxmemory` (writes refused
with an OOM error, nothing half done): trimming comes first in the loop because it frees memory even
then (shared/stream_trim.py).
"""

from __future__ import annotations

import logging
import threading

import redis

from services.reward.decode import CompletionDecoder
from services.reward.evaluation import WorkerEvaluations
from services.reward.provenance import ForgedRolloutError, ProducerCheck
from services.reward.scoring import UNSCORABLE_ERRORS, GroupScorer
from services.reward.settings import RewardSettings
from services.reward.task_feed import TaskFeed
from shared import worker_rewards
from shared.bus import Delivery, StreamBus
from shared.config import RunConfig
from shared.keys import GROUPS_SCORED, RunKeys
from shared.messages import RolloutGroup
from shared.retry import Backoff, is_redis_outage
from shared.stream_trim import DEAD_LETTERS_KEPT, ConsumedTrimmer
from shared.streams import EVAL_REQUESTS, EVAL_ROLLOUTS, EVAL_SCORES, ROLLOUTS, SCORED, TASKS
from shared.tasks import TaskAdapter, build_task
from shared.tasks.environment import EnvironmentTask
from shared.verifier_pool import VerifierPool

log = logging.getLogger(__name__)

ROLLOUTS_BLOCK_MS = 50  # the read block on `rollouts`: short, because the task feed is topped up between reads
REFERENCE_TTL_S = 3600  # how long a task's reference (and prompt) is kept for scoring its rollouts


class RewardService:
    def __init__(self, run: RunConfig, settings: RewardSettings, bus: StreamBus) -> None:
        self.run = run
        self.settings = settings
        self.bus = bus
        self.keys = RunKeys(run.run_id)
        self.task: TaskAdapter = build_task(run.task)
        self.producers = ProducerCheck(bus.redis, self.keys)
        self.scorer = GroupScorer(
            self.task.name,
            CompletionDecoder(settings.resolved_model_dir(run.model), run.grpo.max_new_tokens),
            VerifierPool(run.task, run.reward.verifier_timeout_s),
            max_turns=self.task.max_turns if isinstance(self.task, EnvironmentTask) else None,
        )
        self.feed = TaskFeed(bus, self.keys, self.task, run, REFERENCE_TTL_S)
        self.evals = WorkerEvaluations(
            bus,
            self.task,
            run,
            self.scorer,
            self.producers,
            reference_ttl_s=REFERENCE_TTL_S,
            consumer_name=settings.consumer_name,
            claim_idle_ms=settings.claim_idle_ms,
        )
        # the data plane consumes `tasks` (through the work API's leases) and `rollouts`: it trims both, and the
        # evaluation's streams (`eval_scores` too: only what the learner's group finished goes)
        self.trimmer = ConsumedTrimmer(
            bus,
            (TASKS, ROLLOUTS, EVAL_REQUESTS, EVAL_ROLLOUTS, EVAL_SCORES),
            interval_s=settings.trim_interval_s,
            dead_letters_kept=DEAD_LETTERS_KEPT,
        )
        self.stop_event = threading.Event()
        self.num_scored = 0
        self.num_tasks_published = 0

    def run_forever(self) -> None:
        started = False
        backoff = Backoff()
        self.scorer.verifiers.start()
        try:
            while not self.stop_event.is_set():
                try:
                    if not started:
                        self.create_groups()
                        self.finish_own_pending()
                        started = True
                    self.serve_once()
                    backoff.reset()
                except redis.RedisError as exc:  # policy: wait Redis out; nothing unacked is lost
                    if not is_redis_outage(exc):
                        raise
                    backoff.wait(self.stop_event, exc, "redis")
        finally:
            self.scorer.verifiers.close()

    def serve_once(self) -> None:
        self.trimmer.trim_if_due()
        self.num_tasks_published += self.feed.top_up()
        self.score_and_forward(self.receive_rollouts())
        self.evals.serve_once()

    def create_groups(self) -> None:
        # All three groups are created here, before the first task exists, so nothing produced
        # before its consumer starts is missed.
        self.bus.ensure_group(TASKS)
        self.bus.ensure_group(ROLLOUTS)
        self.bus.ensure_group(SCORED)
        self.evals.start()  # the evaluation's groups, and the versions a previous instance left open

    def finish_own_pending(self) -> None:
        """After a restart: rollouts this consumer read but never acked are scored first."""
        self.score_and_forward(self.bus.read_own_pending(ROLLOUTS, self.settings.consumer_name))

    def receive_rollouts(self) -> list[Delivery[RolloutGroup]]:
        claimed = self.bus.claim_stale(
            ROLLOUTS, self.settings.consumer_name, min_idle_ms=self.settings.claim_idle_ms, count=32
        )
        if claimed:
            return claimed
        return self.bus.read(ROLLOUTS, self.settings.consumer_name, count=32, block_ms=ROLLOUTS_BLOCK_MS)

    def score_and_forward(self, deliveries: list[Delivery[RolloutGroup]]) -> None:
        """Scored groups go to `scored` and their rollouts are acked in one transaction."""
        scored, done = [], []
        for delivery in deliveries:
            try:
                self.producers.verify(delivery.message)
                scored.append(self.scorer.score(delivery.message, self.bus.redis, self.keys))
                done.append(delivery)
            # policy: a forged group, or one we cannot score, is dead-lettered, never retried
            except (ForgedRolloutError, *UNSCORABLE_ERRORS) as exc:
                # counted against the worker the group names (the work API checked it is the one that sent it)
                rejected = worker_rewards.rejected_tally(self.keys, delivery.message.worker_id)
                self.bus.dead_letter(delivery, str(exc), tally=rejected)
        self.bus.publish_and_ack(
            SCORED,
            scored,
            done,
            tally=(self.keys.reward_counts, GROUPS_SCORED),
            increments=worker_rewards.increments(self.keys, scored),  # per worker, for the accounting
        )
        self.num_scored += len(scored)
        self.feed.observe(scored)
        self.forget_tasks(done)

    def forget_tasks(self, deliveries: list[Delivery[RolloutGroup]]) -> None:
        """Delete the references of tasks whose group is scored: the work API accepts one group per task,
        so nothing will ask for them again. Without this each one stays in Redis for REFERENCE_TTL_S
        (at 640 tasks/s, an hour of them is ~2.3 million keys); the TTL covers the rest (a dead-lettered
        group's task, a crash between the ack and this)."""
        if deliveries:
            task_ids = {delivery.message.task_id for delivery in deliveries}
            self.bus.redis.delete(
                *(
                    key
                    for task_id in task_ids
                    for key in (self.keys.task_reference(task_id), self.keys.task_prompt(task_id))
                )
            )
