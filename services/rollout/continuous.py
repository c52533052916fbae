"""The worker's continuous mode ([rollout] batching = "continuous"; docs/continuous_batching.md): the engine's
batch stays full and new weights land between two decoding steps, without draining the samples in flight.

One turn (`ContinuousRollouts.serve_once`), the table of contents:
    sync weights      a verified version is loaded between two steps; the engine recomputes the running
                      rows with it at the next step (engines/continuous.py), each row records the token
                      from which the new version sampled
    gate              standby or inadmissible weights: nothing new is leased; rows in flight go on
    fill              lease tasks while the batch has room for all their samples; every sample is a row
    step              one decoding step: admit waiting rows, one token per row, the rows that finished
    submit            every task whose samples have all finished becomes a group (its oldest version as
                      policy_version, later versions as version_changes) and goes to the coordinator

Multi-turn tasks (an environment) are played batch-at-a-time, as in batch mode, between two steps.
Stopping finishes the rows in flight and submits them first (`finish`), like batch mode's current batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engines.continuous import ContinuousBatch, FinishedSample, SampleRequest
from engines.interface import EngineError
from services.rollout.rollout_groups import build_rollout_group
from shared.keyed_sampling import task_seed
from shared.messages import RolloutGroup, pack_int32
from shared.rollout_mac import sign_rollout
from shared.tokenization import PromptInput
from shared.work_api import MAX_GROUPS_PER_LEASE, LeasedTask

if TYPE_CHECKING:
    from services.rollout.worker import Outcome, RolloutWorker

log = logging.getLogger(__name__)

FINISH_TIMEOUT_S = 60.0  # stopping: how long the rows in flight may take to finish before they are dropped


@dataclass
class TaskInFlight:
    """A leased task whose samples are rows of the batch."""

    lease: LeasedTask
    admitted_at_s: float
    samples: dict[int, FinishedSample] = field(default_factory=dict)  # by sample index, as they finish

    @property
    def done(self) -> bool:
        return len(self.samples) == self.lease.task.num_samples


class ContinuousRollouts:
    def __init__(self, worker: RolloutWorker, max_rows: int) -> None:
        self.worker = worker
        self.batch: ContinuousBatch = worker.engine.continuous_batch(max_rows)
        self.tasks: dict[int, TaskInFlight] = {}  # by task number (request ids are task number * 2**16 + j)
        self._next_task = 0
        self._lease_after_s = 0.0  # monotonic: no gate check or lease request before this while rows are in flight

    def serve_once(self) -> None:
        """One turn of the continuous loop: the table of contents of the mode."""
        self.worker.sync_weights()
        if self.lease_due():
            if self.worker.membership.on_standby or not self.worker.has_admissible_weights():
                self._lease_after_s = time.monotonic() + self.worker.settings.worker_poll_s
                if not self.tasks:
                    self.worker.pause()
                    return
            else:
                self.fill()
        if not self.tasks:
            self.worker.wait_for_tasks()
            return
        self.worker.generating = True
        if outcomes := self.step():
            self.worker.submit(outcomes)

    def finish(self) -> None:
        """Stopping: the rows in flight finish and are submitted (at most FINISH_TIMEOUT_S)."""
        deadline_s = time.monotonic() + FINISH_TIMEOUT_S
        while self.tasks and time.monotonic() < deadline_s:
            if outcomes := self.step():
                self.worker.submit(outcomes)
        if self.tasks:
            log.warning(
                "stopping with %d tasks unfinished: their leases expire and go to other workers", len(self.tasks)
            )

    # the turn's steps
    def lease_due(self) -> bool:
        """The batch has free rows and, with rows in flight, the last empty answer or closed gate is at least
        a wait old: the gate and the lease are requests to the coordinator, not to be made every step."""
        room = self.batch.max_rows - self.batch.num_running - self.batch.num_waiting
        return room > 0 and (not self.tasks or time.monotonic() >= self._lease_after_s)

    def fill(self) -> None:
        """Lease tasks while every sample of them fits in the batch's free rows. After an empty answer, the
        rows in flight decode for the worker's idle wait (`next_idle_wait_s`, doubling) before it asks
        again."""
        room = self.batch.max_rows - self.batch.num_running - self.batch.num_waiting
        num_tasks = min(MAX_GROUPS_PER_LEASE, max(1, room // self.worker.run_config.grpo.group_size))
        leased = self.worker.lease_tasks(max_tasks=num_tasks)
        if not leased:
            self._lease_after_s = time.monotonic() + self.worker.next_idle_wait_s()
        episodes = [lease for lease in leased if lease.task.environment is not None]
        if episodes:  # multi-turn: played batch-at-a-time, between two steps
            self.worker.submit(self.worker.generate_groups(episodes))
        for lease in leased:
            if lease.task.environment is None:
                self.admit(lease)

    def admit(self, lease: LeasedTask) -> None:
        task = lease.task
        number = self._next_task
        self._next_task += 1
        try:
            (prompt_ids,) = self.worker.engine.encode_prompts([PromptInput.of_task(task)], task.max_new_tokens)
            seed = task_seed(task.task_id)
            self.batch.add(
                [
                    SampleRequest(
                        request_id(number, j), tuple(prompt_ids), task.max_new_tokens, task.temperature, seed + j
                    )
                    for j in range(task.num_samples)
                ]
            )
        except EngineError as exc:
            self.worker.submit([(lease, exc)])
            return
        self.tasks[number] = TaskInFlight(lease, time.perf_counter())

    def step(self) -> list[Outcome]:
        """One decoding step; the groups of the tasks it completed, signed."""
        started_s = time.perf_counter()
        finished = self.batch.step()
        step_s = time.perf_counter() - started_s
        stats = self.batch.last_step
        num_rows = stats.num_rows if stats is not None else 0
        if stats is not None and stats.recompute_s > 0:  # the swap's pause: its load, then this recompute
            self.worker.swap_pauses.extend_last(stats.recompute_s)
        self.worker.throughput.record(len(finished), step_s, num_rows)
        self.worker.occupancy.observe(num_rows, self.batch.max_rows)
        touched = set()
        for sample in finished:
            number, j = divmod(sample.request_id, REQUESTS_PER_TASK)
            self.tasks[number].samples[j] = sample
            touched.add(number)
        completed = [self.tasks.pop(number) for number in sorted(touched) if self.tasks[number].done]
        if not completed:
            return []
        registration = self.worker.membership.registration  # the id and its key from the same registration
        rollout_key = bytes.fromhex(registration.access.rollout_key_hex)
        return [(task.lease, sign_rollout(group_of(task, registration.worker_id), rollout_key)) for task in completed]


REQUESTS_PER_TASK = 1 << 16  # a request id is task number * this + sample index


def request_id(task_number: int, sample_index: int) -> int:
    return task_number * REQUESTS_PER_TASK + sample_index


def group_of(task: TaskInFlight, worker_id: str) -> RolloutGroup:
    """The task's group: policy_version the oldest version of any token, later versions as change points."""
    samples = [task.samples[j] for j in range(task.lease.task.num_samples)]
    oldest = min(sample.oldest_version for sample in samples)
    changes = [
        (index, change.token_index, change.policy_version)
        for index, sample in enumerate(samples)
        for change in sample.versions
        if change.policy_version > oldest
    ]
    return build_rollout_group(
        task.lease.task,
        [sample.sample for sample in samples],
        worker_id,
        oldest,
        time.perf_counter() - task.admitted_at_s,
        version_changes=pack_int32([value for triple in changes for value in triple]),
    )
