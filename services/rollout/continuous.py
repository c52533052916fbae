"""The worker's continuous mode ([rollout] batching = "continuous"; docs/continuous_batching.md): the engine's
batch stays full and new weights land between two decoding steps, without draining the samples in flight.

One turn (`ContinuousRollouts.serve_once`), the table of contents:
    sync weights      a verified version is loaded between two steps; the engine recomputes the running
                      rows with it at the next step (engines/continuous.py), each row records the token
                      from which the new version sampled
    gate              standby or inadmissible weights: nothing new is leased; rows in flight go on
    fill              lease tasks while the batch has room for all their samples; every sample of a
                      single-turn task is a row, every episode of a multi-turn task has its next model
                      turn as a row (services/rollout/continuous_tasks.py)
    eval tasks        leased with the engine's version (services/rollout/eval_tasks.py): from then on no weights
                      load and nothing is leased until the rows in flight have finished; then the eval tasks are
                      decoded greedily in one engine call with those same weights, answered, and the loop goes on.
                      (A separate greedy call beside rows in flight would be unsafe on vLLM, whose offline
                      generate steps every request in its engine.)
    step              one decoding step: admit waiting rows, one token per row, the rows that finished; a
                      finished turn steps its environment and, if the episode goes on, queues the next turn
    submit            every task whose samples (or episodes) have all finished becomes a group (its oldest
                      version as policy_version, later versions as version_changes) and goes to the
                      coordinator; a task the engine could not serve is given back alone

Stopping finishes the rows in flight and submits them first (`finish`), like batch mode's current batch.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from engines.interface import EngineError
from services.rollout.continuous_tasks import ContinuousTasks
from services.rollout.eval_tasks import split_evals
from shared.rollout_mac import sign_rollout
from shared.work_api import MAX_GROUPS_PER_LEASE, LeasedTask

if TYPE_CHECKING:
    from services.rollout.batch_generation import Outcome
    from shared.api import RegisterWorkerResponse

log = logging.getLogger(__name__)

FINISH_TIMEOUT_S = 60.0  # stopping: how long the rows in flight may take to finish before they are dropped


class WorkerLoop(Protocol):
    """What the continuous loop asks of the worker that runs it (services/rollout/worker.py RolloutWorker): the
    worker's own steps, the ones batch mode takes too, and where each decoding step's numbers go."""

    generating: bool  # the heartbeat's: samples are being decoded

    @property
    def registration(self) -> RegisterWorkerResponse:
        """The current registration: the worker id groups are built with and the key that signs them."""

    def sync_weights(self) -> None:
        """Load the newest verified version, if one is ready (between two decoding steps)."""

    def may_lease(self) -> bool:
        """False on standby or while the staleness gate is closed."""

    def pause(self) -> None:
        """Standby or a closed gate with nothing in flight: wait a poll interval."""

    def lease_tasks(self, max_tasks: int | None = None) -> list[LeasedTask]:
        """Tasks leased from the coordinator, the engine's version's eval tasks first; maybe none."""

    def next_idle_wait_s(self) -> float:
        """How long to wait after an empty lease (doubling up to a maximum)."""

    def wait_for_tasks(self) -> None:
        """Nothing in flight and no task: wait before asking again."""

    def serve_evals(self, evals: list[LeasedTask]) -> None:
        """Decode eval tasks greedily with the weights the engine holds, and answer them."""

    def submit(self, outcomes: list[Outcome]) -> None:
        """Hand groups to the coordinator; give back the tasks the engine could not serve."""

    def record_generation(self, num_samples: int, generation_s: float, num_tokens: int, num_places: int) -> None:
        """One decoding step's throughput and occupancy."""

    def extend_swap_pause(self, extra_s: float) -> None:
        """The last swap's pause went on: the rows in flight were recomputed with the new weights."""


class ContinuousRollouts:
    def __init__(self, worker: WorkerLoop, tasks: ContinuousTasks, *, group_size: int, poll_s: float) -> None:
        """`tasks`: the batch's tasks on the worker's engine; `group_size`: samples per task (the run's), to
        lease as many tasks as the free rows hold; `poll_s`: the wait before asking again after a closed gate."""
        self.worker = worker
        self.tasks = tasks
        self.group_size = group_size
        self.poll_s = poll_s
        self._lease_after_s = 0.0  # monotonic: no gate check or lease request before this while rows are in flight
        self.pending_evals: list[LeasedTask] = []  # eval leases waiting for the rows in flight to finish

    def serve_once(self) -> None:
        """One turn of the continuous loop: the table of contents of the mode."""
        if self.pending_evals and not self.tasks.in_flight:
            self.serve_evals()
        if not self.pending_evals:  # while eval leases wait, their version stays loaded and nothing is leased
            self.worker.sync_weights()
            if self.lease_due():
                if not self.worker.may_lease():
                    self._lease_after_s = time.monotonic() + self.poll_s
                    if not self.tasks.in_flight:
                        self.worker.pause()
                        return
                else:
                    self.fill()
        if not self.tasks.in_flight:
            if not self.pending_evals:
                self.worker.wait_for_tasks()
            return
        self.worker.generating = True
        if outcomes := self.step():
            self.worker.submit(outcomes)

    def finish(self) -> None:
        """Stopping: the rows in flight finish and are submitted (at most FINISH_TIMEOUT_S)."""
        deadline_s = time.monotonic() + FINISH_TIMEOUT_S
        while self.tasks.in_flight and time.monotonic() < deadline_s:
            if outcomes := self.step():
                self.worker.submit(outcomes)
        if self.tasks.in_flight:
            log.warning(
                "stopping with %d tasks unfinished: their leases expire and go to other workers",
                len(self.tasks.in_flight),
            )
        if self.pending_evals and not self.tasks.in_flight:
            self.serve_evals()

    # the turn's steps
    def lease_due(self) -> bool:
        """The batch has free rows and, with rows in flight, the last empty answer or closed gate is at least
        a wait old: the gate and the lease are requests to the coordinator, not to be made every step."""
        return self.tasks.room > 0 and (not self.tasks.in_flight or time.monotonic() >= self._lease_after_s)

    def fill(self) -> None:
        """Lease tasks while every sample of them fits in the batch's free rows; queue their first rows. After
        an empty answer, the rows in flight decode for the worker's idle wait (`next_idle_wait_s`, doubling)
        before it asks again."""
        num_tasks = min(MAX_GROUPS_PER_LEASE, max(1, self.tasks.room // self.group_size))
        self.pending_evals, leased = split_evals(self.worker.lease_tasks(max_tasks=num_tasks))
        if not leased and not self.pending_evals:
            self._lease_after_s = time.monotonic() + self.worker.next_idle_wait_s()
        for lease in leased:
            try:
                self.tasks.admit(lease)
            except EngineError as exc:  # this task alone
                self.worker.submit([(lease, exc)])

    def serve_evals(self) -> None:
        """The eval leases, decoded greedily with the weights they were leased for (eval_tasks.py)."""
        evals, self.pending_evals = self.pending_evals, []
        self.worker.serve_evals(evals)

    def step(self) -> list[Outcome]:
        """One decoding step; the groups of the tasks it completed, signed, and the tasks that failed."""
        started_s = time.perf_counter()
        stepped = self.tasks.step()
        step_s = time.perf_counter() - started_s
        stats = self.tasks.batch.last_step
        if stats is not None and stats.recompute_s > 0:  # the swap's pause: its load, then this recompute
            self.worker.extend_swap_pause(stats.recompute_s)
        # a step decodes one token per row, on the batch's max_rows places
        self.worker.record_generation(stepped.num_samples_done, step_s, stepped.num_rows, self.tasks.batch.max_rows)
        outcomes: list[Outcome] = list(stepped.failed)
        if stepped.completed:
            registration = self.worker.registration  # the id and its key from the same registration
            rollout_key = bytes.fromhex(registration.access.rollout_key_hex)
            outcomes += [
                (task.lease, sign_rollout(task.group(registration.worker_id), rollout_key))
                for task in stepped.completed
            ]
        return outcomes
