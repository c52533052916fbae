"""The rollout worker: turns TaskGroups into RolloutGroups with announced, verified policy weights.

Main loop (`RolloutWorker.run`):
    start: chunk server -> register -> Redis as the issued user -> heartbeat thread
    loop:  sync weights -> gate on staleness -> receive tasks -> (pull mode: wait for the version the
           tasks ask for) -> generate -> publish -> ack
    stop:  finish the current batch -> deregister -> stop the chunk server

Every group is signed with the rollout key its registration issued (shared/rollout_mac.py).
Delivery: a task is acked only after its RolloutGroup is in Redis; a worker that dies leaves its tasks
pending and another worker claims them after `rollout.claim_idle_ms`. A task the engine cannot serve
(EngineError, e.g. a prompt outside the tokenizer's vocabulary) is dead-lettered alone; the rest of
its batch is still sampled.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict, deque

import redis

from engines.interface import EngineError, InferenceEngine
from services.rollout.coordinator_client import CoordinatorClient, CoordinatorUnavailableError
from services.rollout.episodes import EpisodeRunner, build_episode_group
from services.rollout.faults import fault_from_environment, serving_store
from services.rollout.membership import Membership, NotRegisteredError
from services.rollout.prometheus import SwapPauses
from services.rollout.redis_access import connect_as_worker
from services.rollout.relay_sources import CoordinatorParents
from services.rollout.rollout_groups import build_rollout_group
from services.rollout.settings import RolloutSettings
from services.rollout.weight_hold import WeightHold
from services.rollout.weights_sync import WeightsSync
from shared.api import HeartbeatRequest, RegisterWorkerRequest, RegisterWorkerResponse
from shared.bus import Delivery, StreamBus
from shared.chunk_server import ChunkServer
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.lora import base_fingerprint
from shared.messages import RolloutGroup, TaskGroup
from shared.retry import REDIS_OUTAGE_ERRORS, Backoff
from shared.rollout_mac import sign_rollout
from shared.streams import ROLLOUTS, TASKS, WEIGHTS
from shared.tokenization import PromptInput

log = logging.getLogger(__name__)

READ_BLOCK_MS = 1000

# What happened to one task: its group, or the engine error that made it undeliverable.
Outcome = tuple[Delivery[TaskGroup], RolloutGroup | EngineError]


class ThroughputMeter:
    """Samples (and tokens) per second of generation time over the last `window_s` seconds (capacity,
    not idle time), and the mean latency of one engine call (L_gen of the capacity model)."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        # (ended at, num_samples, generation_s, num_tokens)
        self._batches: deque[tuple[float, int, float, int]] = deque()

    def record(self, num_samples: int, generation_s: float, num_tokens: int = 0) -> None:
        now_s = time.monotonic()
        self._batches.append((now_s, num_samples, generation_s, num_tokens))
        while self._batches and self._batches[0][0] < now_s - self.window_s:
            self._batches.popleft()

    def samples_per_s(self) -> float:
        batches = list(self._batches)
        busy_s = sum(batch[2] for batch in batches)
        return sum(batch[1] for batch in batches) / busy_s if busy_s > 0 else 0.0

    def tokens_per_s(self) -> float:
        batches = list(self._batches)
        busy_s = sum(batch[2] for batch in batches)
        return sum(batch[3] for batch in batches) / busy_s if busy_s > 0 else 0.0

    def mean_batch_s(self) -> float:
        batches = list(self._batches)
        return sum(batch[2] for batch in batches) / len(batches) if batches else 0.0


class RolloutWorker:
    def __init__(
        self,
        run: RunConfig,
        settings: RolloutSettings,
        engine: InferenceEngine,
        redis_client: redis.Redis,
        stopping: threading.Event | None = None,
    ) -> None:
        self.run_config = run
        self.settings = settings
        self.engine = engine
        self.keys = RunKeys(run.run_id)
        self.bus = StreamBus(redis_client, self.keys, service="rollout")
        self.stopping = stopping or threading.Event()  # set by stop() or the process's signal handler
        self.fault = fault_from_environment()  # None unless a test asked for a lying worker (faults.py)
        # holds (and relays) only manifests the learner signed; a test's lying relay serves them tampered with
        self.store = serving_store(
            self.fault, run.broadcast.keep_versions, settings.public_key(), spill_dir=engine.weights_dir
        )
        self.chunk_server = ChunkServer(
            self.store, host=settings.worker_host, port=settings.worker_port, wait_s=run.broadcast.chunk_wait_s
        )
        self.weights = WeightsSync(
            self.bus,
            self.store,
            settings.public_key(),
            fetch_timeout_s=run.broadcast.chunk_wait_s + 5.0,
            # relay: stream from the parent the coordinator assigns; fetching runs on its own thread
            parents=CoordinatorParents(settings.coordinator_url, lambda: self.membership.worker_id),
            own_url=settings.resolved_public_url(self.chunk_server.url),
            stall_timeout_s=run.broadcast.stall_timeout_s,
            chunk_wait_s=run.broadcast.chunk_wait_s,
            version_timeout_s=run.broadcast.version_timeout_s,
            model_fingerprint=engine.model_fingerprint,
            # a LoRA run: adapters apply only onto the learner's base (hashing the base's files once)
            base_fingerprint=base_fingerprint(engine.model_dir) if run.lora.enabled and engine.model_dir else "",
        )
        self.coordinator = CoordinatorClient(settings.coordinator_url)
        self.membership = Membership(
            CoordinatorClient(settings.coordinator_url, join_token=settings.join_token_value()),
            self._registration_request(),
            self.report,
            self.stopping,
        )
        self.consumer_name = f"{settings.worker_name}-{uuid.uuid4().hex[:8]}"
        self.num_groups_done = 0
        self.num_samples_done = 0
        self.num_dead_lettered = 0
        self.generating = False
        self.throughput = ThroughputMeter()
        self.swap_pauses = SwapPauses()  # every swap's rollout pause, for /metrics
        self.gate_state = "closed"
        self.hold = WeightHold(run.rollout.hold_versions_max)  # an ablation's knob; off (0) otherwise
        self._episode_runner: EpisodeRunner | None = None

    def run(self) -> None:
        """Serve tasks until `stop()`; the current batch is always finished (published and acked) first."""
        try:
            self.start()
            backoff = Backoff()
            while not self.stopping.is_set():
                self.membership.raise_if_failed()
                try:
                    self.serve_once()
                    backoff.reset()
                except REDIS_OUTAGE_ERRORS as exc:
                    # Unacked tasks stay pending in Redis and are redelivered; nothing is lost by waiting.
                    backoff.wait(self.stopping, exc, "redis")
        except NotRegisteredError:
            log.info("stopped before registering")
        finally:
            self.shut_down()

    def serve_once(self) -> None:
        """One turn of the loop: the table of contents of the worker."""
        self.sync_weights()
        if self.membership.on_standby or not self.has_admissible_weights():  # standby: weights fresh, no tasks
            self.pause()
            return
        deliveries = self.receive_tasks()
        self.generating = bool(deliveries)
        if deliveries:
            self.sync_weights()  # the read may have blocked while a newer version was announced
            self.wait_for_version(max(delivery.message.min_policy_version for delivery in deliveries))
            outcomes = self.generate_groups(deliveries)
            self.publish_and_ack(outcomes)

    def stop(self) -> None:
        self.stopping.set()

    # start and stop
    def start(self) -> None:
        self.chunk_server.start()
        log.info("chunk server on %s; consumer %s", self.chunk_server.url, self.consumer_name)
        registration = self.membership.register()
        if registration.run_id != self.keys.run_id:
            raise ValueError(
                f"the coordinator at {self.settings.coordinator_url} runs {registration.run_id!r}, not {self.keys.run_id!r}"
            )
        self.use_issued_redis_user()  # no Redis command before this: with ACLs on, only the issued user may
        self.bus.ensure_group(TASKS)
        self.membership.start_heartbeats()
        self.weights.start()
        log.info("waiting for the first announced weights on %s", self.keys.name_of(WEIGHTS))

    def use_issued_redis_user(self) -> None:
        """Talk to Redis as the user the registration issued (services/rollout/redis_access.py); later
        registrations' credentials are picked up at each reconnect. ACLs off: keep the given client."""
        issued = connect_as_worker(
            self.membership.registration.access, lambda: self.membership.registration.access, self.settings.redis_url
        )
        if issued is not None:
            self.bus.redis.close()
            self.bus.redis = issued
            log.info("redis as user %s", self.membership.registration.access.redis_username)

    def shut_down(self) -> None:
        self.generating = False
        self.weights.close()  # before leaving: the coordinator kills our Redis connections when we deregister
        self.membership.leave()
        self.chunk_server.stop()
        self.coordinator.close()
        self.membership.client.close()
        log.info(
            "stopped: %d groups, %d samples, %d dead-lettered",
            self.num_groups_done,
            self.num_samples_done,
            self.num_dead_lettered,
        )

    # the loop's steps
    def sync_weights(self) -> None:
        if self.fault is not None and not self.fault.loads_weights(self.engine.policy_version):
            return
        if self.hold.active and not self.hold.releases(self.engine.policy_version, self.newest_announced_version()):
            return
        loaded_version = self.weights.update(self.engine)
        if loaded_version is not None:
            self.hold.redraw()
            swap = self.weights.last_swap
            pause_s = swap.pause_s if swap is not None else None
            if pause_s is not None:
                self.swap_pauses.observe(pause_s)
            log.info(
                "now sampling with policy version %d (engine paused %.3fs to load it)", loaded_version, pause_s or 0.0
            )

    def wait_for_version(self, min_policy_version: int) -> None:
        """Pull mode: the learner asked for these tasks at `min_policy_version`; sample them with weights at
        least that new. Waits at most `version_timeout_s` for them (then samples with what it has: the
        learner's admission rule still decides) and never past stop()."""
        if self.engine.policy_version >= min_policy_version:
            return
        deadline_s = time.monotonic() + self.run_config.broadcast.version_timeout_s
        while self.engine.policy_version < min_policy_version and time.monotonic() < deadline_s:
            if self.stopping.wait(self.settings.worker_poll_s / 4):
                return
            self.sync_weights()
        if self.engine.policy_version < min_policy_version:
            log.warning(
                "tasks ask for version %d; still at %d after %.0fs: sampling them anyway",
                min_policy_version,
                self.engine.policy_version,
                self.run_config.broadcast.version_timeout_s,
            )

    def newest_announced_version(self) -> int | None:
        newest = self.bus.latest_entry(WEIGHTS)
        return None if newest is None else newest.message.policy_version

    def has_admissible_weights(self) -> bool:
        """False before the first verified weights, and while the coordinator says groups sampled with
        our version could no longer be trained on (no wasted work; wait for newer weights)."""
        if self.engine.policy_version < 0:
            return False
        try:
            verdict = self.coordinator.staleness(self.claimed_version())
        except CoordinatorUnavailableError as exc:
            # Fail open: the learner's admission rule drops stale groups anyway; the gate only saves work.
            self._note_gate("failing open", f"coordinator unavailable ({exc})")
            return True
        if verdict.admissible:
            self._note_gate(
                "open", f"version {verdict.policy_version} admissible for {verdict.steps_remaining} more steps"
            )
            return True
        self._note_gate(
            "closed",
            f"version {verdict.policy_version} too old for learner {verdict.learner_version} (S={verdict.staleness_bound})",
        )
        return False

    def pause(self) -> None:
        self.generating = False
        self.stopping.wait(self.settings.worker_poll_s)

    def receive_tasks(self) -> list[Delivery[TaskGroup]]:
        """Tasks a dead consumer left pending first, then new ones (blocking up to READ_BLOCK_MS)."""
        count = self.settings.worker_max_groups_per_batch
        claimed = self.bus.claim_stale(
            TASKS, self.consumer_name, min_idle_ms=self.run_config.rollout.claim_idle_ms, count=count
        )
        if claimed:
            log.info("claimed %d stale tasks", len(claimed))
            return claimed
        return self.bus.read(TASKS, self.consumer_name, count=count, block_ms=READ_BLOCK_MS)

    def generate_groups(self, deliveries: list[Delivery[TaskGroup]]) -> list[Outcome]:
        """Sample every task; tasks sharing sampling parameters go through the engine in one call."""
        batches: dict[tuple[int, int, float, bool], list[Delivery[TaskGroup]]] = defaultdict(list)
        for delivery in deliveries:
            task = delivery.message
            is_episode = task.environment is not None  # multi-turn: played by services/rollout/episodes.py
            batches[(task.num_samples, task.max_new_tokens, task.temperature, is_episode)].append(delivery)
        outcomes: list[Outcome] = []
        for batch in batches.values():
            outcomes.extend(self._generate_batch(batch))
        return outcomes

    def publish_and_ack(self, outcomes: list[Outcome]) -> None:
        """The batch's groups go to `rollouts` and their tasks are acked in one transaction."""
        groups = [(delivery, result) for delivery, result in outcomes if isinstance(result, RolloutGroup)]
        self.bus.publish_and_ack(ROLLOUTS, [group for _, group in groups], [delivery for delivery, _ in groups])
        self.num_groups_done += len(groups)
        self.num_samples_done += sum(group.num_samples for _, group in groups)
        for delivery, result in outcomes:
            if isinstance(result, EngineError):
                self.bus.dead_letter(delivery, f"{type(result).__name__}: {result}")
                self.num_dead_lettered += 1

    def report(self) -> HeartbeatRequest:
        """What the heartbeat thread tells the coordinator."""
        return HeartbeatRequest(
            policy_version=self.engine.policy_version,
            num_groups_done=self.num_groups_done,
            num_samples_done=self.num_samples_done,
            samples_per_s=self.throughput.samples_per_s(),
            generating=self.generating,
            last_swap=self.weights.last_swap,
            tokens_per_s=self.throughput.tokens_per_s(),
            group_latency_s=self.throughput.mean_batch_s(),
        )

    # helpers
    def _generate_batch(self, batch: list[Delivery[TaskGroup]]) -> list[Outcome]:
        """One engine call for the batch (one per turn for episodes); if it fails, one call per task so a
        bad task fails alone."""
        policy_version = self.claimed_version()
        try:
            if batch[0].message.environment is None:
                built, registration = self._sample_groups(batch, policy_version)
            else:
                built, registration = self._play_episodes(batch, policy_version)
        except EngineError as exc:
            if len(batch) == 1:
                return [(batch[0], exc)]
            return [outcome for delivery in batch for outcome in self._generate_batch([delivery])]
        if (
            self.fault is not None
        ):  # a lying worker signs its lies: the MAC binds a group to its producer, not to the truth
            built = [self.fault.apply(group) for group in built]
        rollout_key = bytes.fromhex(registration.access.rollout_key_hex)
        return [(delivery, sign_rollout(group, rollout_key)) for delivery, group in zip(batch, built, strict=True)]

    def _sample_groups(
        self, batch: list[Delivery[TaskGroup]], policy_version: int
    ) -> tuple[list[RolloutGroup], RegisterWorkerResponse]:
        """Single-turn tasks: every sample of every task in one engine call."""
        first = batch[0].message
        started_s = time.perf_counter()
        groups = self.engine.generate(
            [PromptInput.of_task(d.message) for d in batch],
            first.num_samples,
            first.max_new_tokens,
            first.temperature,
        )
        generation_s = time.perf_counter() - started_s
        self.throughput.record(
            sum(len(samples) for samples in groups),
            generation_s,
            sum(s.num_tokens for samples in groups for s in samples),
        )
        registration = self.membership.registration  # the id and its key from the same registration
        built = [
            build_rollout_group(delivery.message, samples, registration.worker_id, policy_version, generation_s)
            for delivery, samples in zip(batch, groups, strict=True)
        ]
        return built, registration

    def _play_episodes(
        self, batch: list[Delivery[TaskGroup]], policy_version: int
    ) -> tuple[list[RolloutGroup], RegisterWorkerResponse]:
        """Multi-turn tasks: every episode of every task played together (services/rollout/episodes.py)."""
        started_s = time.perf_counter()
        episodes = self.episode_runner().play([delivery.message for delivery in batch])
        generation_s = time.perf_counter() - started_s
        self.throughput.record(
            sum(len(group) for group in episodes),
            generation_s,
            sum(sum(episode.mask) for group in episodes for episode in group),  # the model's tokens
        )
        registration = self.membership.registration
        built = [
            build_episode_group(delivery.message, group, registration.worker_id, policy_version, generation_s)
            for delivery, group in zip(batch, episodes, strict=True)
        ]
        return built, registration

    def episode_runner(self) -> EpisodeRunner:
        """Plays multi-turn tasks; built on the first one (it builds the run's task adapter)."""
        if self._episode_runner is None:
            self._episode_runner = EpisodeRunner(self.engine, self.run_config.task)
        return self._episode_runner

    def claimed_version(self) -> int:
        """The version written on the groups: the engine's, unless a fault injector lies about it."""
        if self.fault is None:
            return self.engine.policy_version
        newest = self.bus.latest_entry(WEIGHTS)
        return self.fault.claimed_version(self.engine.policy_version, newest.message.policy_version if newest else None)

    def _registration_request(self) -> RegisterWorkerRequest:
        return RegisterWorkerRequest(
            name=self.settings.worker_name,
            endpoint_url=self.settings.resolved_public_url(self.chunk_server.url),
            gpu_type=self.settings.worker_gpu_type,
            price_per_hour=self.settings.worker_price_per_hour,
            bandwidth_mbps=self.settings.worker_bandwidth_mbps,
            region=self.settings.worker_region,
        )

    def _note_gate(self, state: str, why: str) -> None:
        """Log the staleness gate when it opens or closes, not on every check."""
        if state != self.gate_state:
            log.info("staleness gate %s: %s", state, why)
            self.gate_state = state


def build_engine(settings: RolloutSettings, run: RunConfig) -> InferenceEngine:
    """The engine the run file (or RL_WORKER_ENGINE) names, on the model folder."""
    from engines.select import build_engine as build

    kind = settings.worker_engine or run.rollout.engine
    return build(
        kind,
        settings.resolved_model_dir(run.model),
        run.rollout,
        num_threads=settings.worker_num_threads,
        max_lora_rank=run.lora.rank if run.lora.enabled else 0,
    )
