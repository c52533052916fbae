"""The rollout worker: turns TaskGroups into RolloutGroups with announced, verified policy weights.

Main loop (`RolloutWorker.run`):
    start: chunk server -> register -> heartbeat thread -> weight announcements
    loop:  sync weights -> gate on staleness -> lease tasks (eval tasks of the engine's version first) ->
           eval tasks: decode greedily with these very weights, answer (services/rollout/eval_tasks.py) ->
           (pull mode: wait for the version the tasks ask for) -> generate -> submit
    stop:  finish the current batch -> deregister -> stop the chunk server

The worker holds no Redis credentials: it leases tasks and submits groups through the coordinator's work
API (services/rollout/work_client.py, shared/work_api.py), which checks each answer and does the stream
operations. Every group is signed with the rollout key its registration issued (shared/rollout_mac.py).
Delivery: a leased task is done once the coordinator accepts its group (on `rollouts` and acked in one
step); a worker that dies leaves its leases unanswered and they go to another worker after
`rollout.claim_idle_ms`. A task the engine cannot serve (EngineError, e.g. a prompt outside the
tokenizer's vocabulary) is given back alone (dead-lettered); the rest of its batch is still sampled.
"""

from __future__ import annotations

import logging
import threading
import time

from engines.interface import EngineError, InferenceEngine
from services.rollout.announcement_client import HttpAnnouncements
from services.rollout.batch_generation import BatchGenerator, Outcome
from services.rollout.continuous import ContinuousRollouts
from services.rollout.continuous_tasks import ContinuousTasks
from services.rollout.coordinator_client import CoordinatorClient, CoordinatorUnavailableError, WorkerExpiredError
from services.rollout.eval_tasks import max_eval_groups, serve_evals, split_evals
from services.rollout.membership import Membership, NotRegisteredError
from services.rollout.prometheus import BatchOccupancy, SwapPauses
from services.rollout.relay_sources import CoordinatorParents
from services.rollout.settings import RolloutSettings
from services.rollout.throughput import ThroughputMeter
from services.rollout.weight_hold import WeightHold
from services.rollout.weights_sync import WeightsSync
from services.rollout.work_client import WorkClient
from shared.api import HeartbeatRequest, RegisterWorkerRequest, RegisterWorkerResponse
from shared.config import RunConfig
from shared.messages import RolloutGroup
from shared.retry import Backoff
from shared.tls import Verify
from shared.weight_channel import ChunkServer, ChunkStore, WeightFollower, base_fingerprint
from shared.work_api import LeasedTask

log = logging.getLogger(__name__)

# While no task comes: wait this long before asking again, doubling up to the maximum (a lease call
# answers at once; the old blocking read of `tasks` waited up to 1 s)
IDLE_WAIT_MIN_S = 0.02
IDLE_WAIT_MAX_S = 0.5
# a coordinator outage: retry with backoff up to this (its leases expire and are reissued meanwhile)
COORDINATOR_MAX_BACKOFF_S = 2.0


class RolloutWorker:
    def __init__(
        self,
        run: RunConfig,
        settings: RolloutSettings,
        engine: InferenceEngine,
        stopping: threading.Event | None = None,
        store: ChunkStore | None = None,
    ) -> None:
        """Built from named parts (below): the chunk store and its server, the weights it follows, its clients of
        the coordinator, the loop's counters and meters, what generates a batch, and in continuous mode the
        continuous loop. `store`: the
        chunk store the worker holds and relays weights from (default: `honest_chunk_store`; the trust tests pass
        a lying one, benchmarks/liars.py)."""
        self.run_config = run
        self.settings = settings
        self.engine = engine
        self.run_id = run.run_id
        self.stopping = stopping or threading.Event()  # set by stop() or the process's signal handler
        self.store = store if store is not None else honest_chunk_store(run, settings, engine)
        self.chunk_server = ChunkServer(
            self.store, host=settings.worker_host, port=settings.worker_port, wait_s=run.broadcast.chunk_wait_s
        )
        verify = settings.coordinator_verify()  # the run CA or the pin: checked before any token is sent
        self.weights = self._weights_sync(verify)
        self.coordinator = CoordinatorClient(settings.coordinator_url, verify=verify)
        self.work = WorkClient(settings.coordinator_url, self.token, run.run_id, verify=verify)
        self.membership = Membership(
            CoordinatorClient(settings.coordinator_url, join_token=settings.join_token_value(), verify=verify),
            self._registration_request(),
            self.report,
            self.stopping,
        )
        self._init_loop_state()
        self.generation = BatchGenerator(
            engine,
            run.task,
            settings.worker_max_groups_per_batch,
            lambda: self.membership.registration,
            self.record_generation,
        )
        self.continuous = self._continuous_rollouts()  # None: batch mode

    # construction: the parts __init__ names
    def _weights_sync(self, verify: Verify) -> WeightsSync:
        """Follows the learner's announcements (a long poll of the coordinator) and fetches each version through
        the relay into the chunk store, verified (services/rollout/weights_sync.py)."""
        run, settings = self.run_config, self.settings
        return WeightsSync(
            HttpAnnouncements(settings.coordinator_url, self.token, verify=verify),
            WeightFollower(
                self.store,
                settings.public_key(),
                run_id=run.run_id,
                fetch_timeout_s=run.broadcast.chunk_wait_s + 5.0,
                # relay: stream from the parent the coordinator assigns; fetching runs on its own thread
                parents=CoordinatorParents(settings.coordinator_url, lambda: self.membership.worker_id, verify=verify),
                own_url=settings.resolved_public_url(self.chunk_server.url),
                stall_timeout_s=run.broadcast.stall_timeout_s,
                chunk_wait_s=run.broadcast.chunk_wait_s,
                version_timeout_s=run.broadcast.version_timeout_s,
                model_fingerprint=self.engine.model_fingerprint,
                # a LoRA run: adapters apply only onto the learner's base (hashing the base's files once)
                base_fingerprint=(
                    base_fingerprint(self.engine.model_dir) if run.lora.enabled and self.engine.model_dir else ""
                ),
            ),
        )

    def _init_loop_state(self) -> None:
        """The loop's counters (the heartbeat's), meters (/metrics) and flags, as at start."""
        self.num_groups_done = 0  # groups the coordinator accepted
        self.num_samples_done = 0
        self.num_dead_lettered = 0  # tasks given back (engine errors) and groups refused
        self.idle_wait_s = IDLE_WAIT_MIN_S
        self.generating = False
        self.throughput = ThroughputMeter()
        self.swap_pauses = SwapPauses()  # every swap's rollout pause, for /metrics
        self.occupancy = BatchOccupancy()  # how full the engine's batch was, for /metrics
        self.gate_state = "closed"
        self.answered_evals = False  # the last turn answered eval tasks: lease again before loading weights
        self.gated_s_total = 0.0  # seconds held by the staleness gate (shared/time_use.py)
        self.waiting_for_tasks_s_total = 0.0  # seconds waiting because a lease brought no task
        self.hold = WeightHold(self.run_config.rollout.hold_versions_max)  # an ablation's knob; off (0) otherwise

    def _continuous_rollouts(self) -> ContinuousRollouts | None:
        """[rollout] batching = "continuous": the loop that keeps the engine's batch full
        (services/rollout/continuous.py), talking to this worker as its WorkerLoop; None in batch mode."""
        rollout = self.run_config.rollout
        if rollout.batching != "continuous":
            return None
        return ContinuousRollouts(
            self,
            ContinuousTasks(self.engine, rollout.continuous_max_rows, self.generation.episode_runner),
            group_size=self.run_config.grpo.group_size,
            poll_s=self.settings.worker_poll_s,
        )

    def run(self) -> None:
        """Serve tasks until `stop()`; the current batch is always finished (submitted) first."""
        try:
            self.start()
            backoff = Backoff(max_s=COORDINATOR_MAX_BACKOFF_S)
            while not self.stopping.is_set():
                self.membership.raise_if_failed()
                try:
                    self.continuous.serve_once() if self.continuous is not None else self.serve_once()
                    backoff.reset()
                except (CoordinatorUnavailableError, WorkerExpiredError) as exc:
                    # Unanswered leases expire and are reissued; nothing is lost by waiting. A dead worker
                    # (410) waits for its membership to register it again.
                    backoff.wait(self.stopping, exc, "the work API")
            if self.continuous is not None:
                self.continuous.finish()
        except NotRegisteredError:
            log.info("stopped before registering")
        finally:
            self.shut_down()

    def serve_once(self) -> None:
        """One turn of the loop: the table of contents of the worker."""
        if not self.answered_evals:  # else ask once more at this version first: more of its eval tasks may wait
            self.sync_weights()
        self.answered_evals = False
        if not self.may_lease():  # standby: weights fresh, no tasks
            self.pause()
            return
        leased = self.lease_tasks()
        self.generating = bool(leased)
        if not leased:
            self.wait_for_tasks()
            return
        evals, leased = split_evals(leased)
        if evals:  # before any weights load: the version they were leased for (eval_tasks.py)
            self.serve_evals(evals)
            self.answered_evals = True  # a lease carries at most 64: the rest of the version's may still wait
            if not leased:
                return
        self.wait_for_version(max(lease.task.min_policy_version for lease in leased))
        outcomes = self.generation.generate(leased)  # services/rollout/batch_generation.py
        self.submit(outcomes)

    def stop(self) -> None:
        self.stopping.set()

    # start and stop
    def start(self) -> None:
        self.chunk_server.start()
        log.info("chunk server on %s", self.chunk_server.url)
        registration = self.membership.register()
        if registration.run_id != self.run_id:
            raise ValueError(
                f"the coordinator at {self.settings.coordinator_url} runs {registration.run_id!r}, not {self.run_id!r}"
            )
        self.membership.start_heartbeats()
        self.weights.start()
        log.info("registered as %s; waiting for the first announced weights", registration.worker_id)

    def token(self) -> str:
        """The bearer token of the current registration (the work API's and the announcements' calls)."""
        return self.membership.registration.token

    def shut_down(self) -> None:
        self.generating = False
        self.weights.close()  # before leaving: its long poll carries our token
        self.membership.leave()
        self.chunk_server.stop()
        self.coordinator.close()
        self.work.close()
        self.membership.client.close()
        log.info(
            "stopped: %d groups, %d samples, %d dead-lettered",
            self.num_groups_done,
            self.num_samples_done,
            self.num_dead_lettered,
        )

    # the loop's steps
    def sync_weights(self) -> None:
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
        return self.weights.newest_announced_version()

    def may_lease(self) -> bool:
        """Not on standby, and the staleness gate open (`has_admissible_weights`; not asked on standby)."""
        return not self.membership.on_standby and self.has_admissible_weights()

    def has_admissible_weights(self) -> bool:
        """False before the first verified weights, and while the coordinator says groups sampled with
        our version could no longer be trained on (no wasted work; wait for newer weights)."""
        if self.engine.policy_version < 0:
            return False
        try:
            verdict = self.coordinator.staleness(self.engine.policy_version)
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
        """Standby, or the staleness gate closed: wait a poll interval (counted as gated time when gated)."""
        self.generating = False
        started_s = time.monotonic()
        self.stopping.wait(self.settings.worker_poll_s)
        if not self.membership.on_standby:
            self.gated_s_total += time.monotonic() - started_s

    def lease_tasks(self, max_tasks: int | None = None) -> list[LeasedTask]:
        """Tasks leased to this worker by the coordinator (expired leases of others first); maybe none.
        At most `max_tasks` (default: worker_max_groups_per_batch), and before them the eval tasks of the
        engine's version (services/rollout/eval_tasks.py); with any of those, no weights are loaded here."""
        version = self.engine.policy_version
        reply = self.work.lease(
            max_tasks or self.settings.worker_max_groups_per_batch,
            policy_version=version if version >= 0 else None,
            max_eval_groups=max_eval_groups(self.settings.worker_max_groups_per_batch, self.run_config.grpo.group_size),
        )
        leased = reply.tasks
        if leased:
            self.idle_wait_s = IDLE_WAIT_MIN_S
            if not any(lease.task.eval_version is not None for lease in leased):
                self.sync_weights()  # a version may have been announced while we waited for tasks
        return leased

    def serve_evals(self, evals: list[LeasedTask]) -> None:
        """Eval tasks: decoded greedily with the weights the engine holds, answered (eval_tasks.py)."""
        registration = self.registration  # the id and its key from the same registration
        rollout_key = bytes.fromhex(registration.access.rollout_key_hex)
        serve_evals(self.engine, self.work, evals, registration.worker_id, rollout_key)

    def wait_for_tasks(self) -> None:
        """No task now: wait before asking again."""
        started_s = time.monotonic()
        self.stopping.wait(self.next_idle_wait_s())
        self.waiting_for_tasks_s_total += time.monotonic() - started_s

    def next_idle_wait_s(self) -> float:
        """How long to wait before asking for tasks again after an empty answer: longer each time up to
        IDLE_WAIT_MAX_S, back to IDLE_WAIT_MIN_S once a lease brings tasks."""
        wait_s = self.idle_wait_s
        self.idle_wait_s = min(self.idle_wait_s * 2, IDLE_WAIT_MAX_S)
        return wait_s

    def submit(self, outcomes: list[Outcome]) -> None:
        """The batch's groups go to the coordinator, which puts each on `rollouts` and acks its task in one
        step; the tasks the engine could not serve are given back (dead-lettered)."""
        groups = {lease.lease_id: result for lease, result in outcomes if isinstance(result, RolloutGroup)}
        answer = self.work.submit(list(groups.items()))
        self.num_groups_done += len(answer.accepted)
        self.num_samples_done += sum(groups[lease_id].num_samples for lease_id in answer.accepted)
        for refusal in answer.refused:  # e.g. a lease that expired and went to another worker meanwhile
            log.warning("group for lease %s refused: %s", refusal.lease_id, refusal.reason)
            self.num_dead_lettered += 1
        for lease, result in outcomes:
            if isinstance(result, EngineError):
                self.work.report_failure(lease.lease_id, f"{type(result).__name__}: {result}")
                self.num_dead_lettered += 1

    def record_generation(self, num_samples: int, generation_s: float, num_tokens: int, num_places: int) -> None:
        """One engine call, or one decoding step in continuous mode: its throughput, and how full its batch was
        (`num_tokens` decoded on `num_places` row places x steps)."""
        self.throughput.record(num_samples, generation_s, num_tokens)
        self.occupancy.observe(num_tokens, num_places)

    def extend_swap_pause(self, extra_s: float) -> None:
        """Continuous mode: the last swap's pause went on while the rows in flight were recomputed."""
        self.swap_pauses.extend_last(extra_s)

    @property
    def registration(self) -> RegisterWorkerResponse:
        """The current registration: the worker id groups are built with and the key that signs them."""
        return self.membership.registration

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
            generating_s_total=self.throughput.generation_s_total,
            gated_s_total=self.gated_s_total,
            waiting_for_tasks_s_total=self.waiting_for_tasks_s_total,
        )

    # helpers
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


def honest_chunk_store(run: RunConfig, settings: RolloutSettings, engine: InferenceEngine) -> ChunkStore:
    """The chunk store a worker holds and relays weights from: it holds only manifests the learner signed, and
    writes full versions into the engine's weights folder where it has one (vLLM loads from files)."""
    return ChunkStore(
        keep_versions=run.broadcast.keep_versions, trusted_key=settings.public_key(), spill_dir=engine.weights_dir
    )


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
