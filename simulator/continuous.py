"""The simulator's continuous mode (SimConfig.batching = "continuous"; docs/continuous_batching.md).

A worker keeps up to R = max_groups_per_batch * G rows decoding, as services/rollout/continuous.py does:
- it leases a task (G rows, queued) whenever its rows running and queued leave room, and admits queued rows
  into free places at once; the staleness gate stops leasing, never the rows already leased;
- a row lasts f * R / mu_i (f a length factor: at full occupancy the worker finishes mu_i samples/s), and
  starts with the newest version the worker holds then: weights land between decoding steps, so a row
  never waits for a batch to end;
- a task's group is scored when its last row ends; its version is its OLDEST row's start version (the
  admission rule of a mixed-version group), which the learner judges as in batch mode;
- a failed worker loses its rows; their tasks come back after claim_idle_s.
The recompute pause per in-flight update is not modelled: give mu_i as measured in continuous mode, loads
included (benchmarks/continuous_engines.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simulator.engine import Kind, SimConfig, Simulation, SimWorker
from simulator.fleet import FleetSampler, WorkerSpec


@dataclass
class TaskRows:
    worker: int
    remaining: int  # rows not finished
    oldest_version: int = 1 << 62
    started_at_s: float = 0.0


@dataclass
class WorkerRows:
    running: dict[int, int] = field(default_factory=dict)  # row id -> task id
    queued: deque[int] = field(default_factory=deque)  # task ids, one entry per row not yet admitted


class ContinuousSimulation(Simulation):
    def __init__(self, config: SimConfig, workers: list[WorkerSpec], sampler: FleetSampler | None = None) -> None:
        self.max_rows = config.max_groups_per_batch * config.group_size
        self.rows: dict[int, WorkerRows] = {}
        self.tasks: dict[int, TaskRows] = {}
        self.next_id = 0
        super().__init__(config, workers, sampler)

    def rows_of(self, w: SimWorker) -> WorkerRows:
        return self.rows.setdefault(w.index, WorkerRows())

    def worker_try_batch(self, w: SimWorker) -> None:
        """Lease while there is room (unless gated), then admit queued rows into free places."""
        if w.state != "active":
            return
        rows = self.rows_of(w)
        held = self.held_version(w)
        if held < 0 or self.learner_version - held > self.config.staleness_bound:  # gated: rows in flight go on
            arrival = self.next_arrival_s(w, held)
            if arrival is not None:
                self.schedule(arrival, Kind.WAKE, w.index)
            else:
                w.waiting_for_weights = True
        else:
            while self.max_rows - len(rows.running) - len(rows.queued) > 0 and self.pool > 0:
                self.pool -= 1
                task_id = self.new_id()
                self.tasks[task_id] = TaskRows(w.index, self.config.group_size, started_at_s=self.now)
                rows.queued.extend([task_id] * self.config.group_size)
            if self.pool <= 0 and len(rows.running) + len(rows.queued) < self.max_rows and w.index not in self.idle_set:
                self.idle_set.add(w.index)
                self.idle_workers.append(w.index)
        if held >= 0:
            self.admit(w, rows, held)
        w.busy = bool(rows.running)
        w.batch_groups = len({task for task in rows.running.values()} | set(rows.queued))

    def admit(self, w: SimWorker, rows: WorkerRows, held: int) -> None:
        factors = self.config.length_factors
        mean_row_s = self.max_rows / w.spec.samples_per_s
        while rows.queued and len(rows.running) < self.max_rows:
            task_id = rows.queued.popleft()
            task = self.tasks[task_id]
            task.oldest_version = min(task.oldest_version, held)
            row_id = self.new_id()
            rows.running[row_id] = task_id
            factor = self.rng.choice(factors) if factors else 1.0
            self.schedule(self.now + factor * mean_row_s, Kind.BATCH_DONE, w.index, row_id)

    def finish_batch(self, w: SimWorker, token: int) -> None:
        """One row ended (token: its id); its task's group is scored once its last row has."""
        rows = self.rows_of(w)
        task_id = rows.running.pop(token, None)
        if task_id is None:
            return  # the worker failed meanwhile
        task = self.tasks[task_id]
        task.remaining -= 1
        if task.remaining == 0:
            del self.tasks[task_id]
            noise = 1 + self.rng.uniform(-self.config.measurement_noise, self.config.measurement_noise)
            w.measured_mu = w.spec.samples_per_s * noise
            w.batch_latency_s = self.now - task.started_at_s
            self.scored.append([self.now + self.config.scoring_s, task.oldest_version, 1])
            self.schedule(self.now + self.config.scoring_s, Kind.SCORED, -1)
        self.worker_try_batch(w)

    def fail(self, w: SimWorker) -> None:
        if w.state == "dead":
            return
        rows = self.rows_of(w)
        lost = {*rows.running.values(), *rows.queued}
        for task_id in lost:
            del self.tasks[task_id]
        self.rows[w.index] = WorkerRows()
        if lost:  # back on `tasks` once another worker claims them
            self.pending_reclaims[w.index] = self.pending_reclaims.get(w.index, 0) + len(lost)
            self.schedule(self.now + self.config.claim_idle_s, Kind.RECLAIM, w.index)
        w.busy, w.batch_groups = False, 0
        super().fail(w)

    def groups_in_flight(self) -> int:
        scored = sum(int(e[2]) for e in self.scored)
        return self.pool + len(self.tasks) + sum(self.pending_reclaims.values()) + scored + self.freed

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id
