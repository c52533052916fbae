"""The simulator's continuous mode (SimConfig.batching = "continuous"; docs/continuous_batching.md).

A worker keeps up to R rows decoding (continuous_max_rows, or max_groups_per_batch * G), as
services/rollout/continuous.py does:
- it leases a task (G rows, queued) whenever its rows running and queued leave room, and admits queued rows
  into free places at once; the staleness gate stops leasing, never the rows already leased
  (lease_newest_only: it also waits, leasing nothing, while a newer version than its own is published);
- a row lasts f * R / mu_i (f a length factor: at full occupancy the worker finishes mu_i samples/s), and
  starts with the newest version the worker holds then: weights land between decoding steps, so a row
  never waits for a batch to end;
- a task's group is scored when its last row ends; its version is its OLDEST row's start version (the
  admission rule of a mixed-version group), which the learner judges as in batch mode; its tokens are
  split over the versions the worker held while each row ran (the token-lag histogram);
- a failed worker loses its rows; their tasks come back after claim_idle_s.
The recompute pause per in-flight update is not modelled: give mu_i as measured in continuous mode, loads
included (benchmarks/continuous_engines.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simulator.engine import Kind, SimConfig, Simulation, SimWorker
from simulator.fleet import FleetSampler, WorkerSpec
from simulator.read_stats import ScoredGroups


@dataclass
class TaskRows:
    worker: int
    remaining: int  # rows not finished
    oldest_version: int = 1 << 62
    started_at_s: float = 0.0
    tokens_by_version: dict[int, float] = field(default_factory=dict)  # in mean-length samples


@dataclass(frozen=True)
class Row:
    task: int
    started_at_s: float
    version: int  # held when the row started
    length_factor: float


@dataclass
class WorkerRows:
    running: dict[int, Row] = field(default_factory=dict)  # by row id
    queued: deque[int] = field(default_factory=deque)  # task ids, one entry per row not yet admitted


class ContinuousSimulation(Simulation):
    def __init__(self, config: SimConfig, workers: list[WorkerSpec], sampler: FleetSampler | None = None) -> None:
        self.max_rows = config.continuous_max_rows or config.max_groups_per_batch * config.group_size
        self.rows: dict[int, WorkerRows] = {}
        self.tasks: dict[int, TaskRows] = {}
        self.next_id = 0
        super().__init__(config, workers, sampler)

    def rows_of(self, w: SimWorker) -> WorkerRows:
        rows = self.rows.get(w.index)
        if rows is None:
            rows = self.rows[w.index] = WorkerRows()
        return rows

    def worker_try_batch(self, w: SimWorker) -> None:
        """Lease while there is room (unless gated), then admit queued rows into free places."""
        if w.state != "active":
            return
        rows = self.rows_of(w)
        held = self.held_version(w)
        if held < 0 or self.learner_version - held > self.config.staleness_bound or self.newer_published(held):
            # gated: rows in flight go on
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
        w.busy = bool(rows.running)  # (batch_groups stays 0: the tasks it holds are in self.tasks)

    def newer_published(self, held: int) -> bool:
        """lease_newest_only: a newer version than `held` is published (the worker waits for it)."""
        return self.config.lease_newest_only and bool(self.versions) and self.versions[-1].version > held

    def admit(self, w: SimWorker, rows: WorkerRows, held: int) -> None:
        factors = self.config.length_factors
        mean_row_s = self.max_rows / w.spec.samples_per_s
        while rows.queued and len(rows.running) < self.max_rows:
            task_id = rows.queued.popleft()
            task = self.tasks[task_id]
            task.oldest_version = min(task.oldest_version, held)
            row_id = self.new_id()
            factor = self.rng.choice(factors) if factors else 1.0
            rows.running[row_id] = Row(task_id, self.now, held, factor)
            self.schedule(self.now + factor * mean_row_s, Kind.BATCH_DONE, w.index, row_id)

    def finish_batch(self, w: SimWorker, token: int) -> None:
        """One row ended (token: its id); its task's group is scored once its last row has."""
        rows = self.rows_of(w)
        row = rows.running.pop(token, None)
        if row is None:
            return  # the worker failed meanwhile
        task = self.tasks[row.task]
        task.remaining -= 1
        for version, share in self.version_shares(w, row).items():
            task.tokens_by_version[version] = task.tokens_by_version.get(version, 0.0) + share * row.length_factor
        if task.remaining == 0:
            del self.tasks[row.task]
            noise = 1 + self.rng.uniform(-self.config.measurement_noise, self.config.measurement_noise)
            w.measured_mu = w.spec.samples_per_s * noise
            w.batch_latency_s = self.now - task.started_at_s
            self.publish_scored(
                ScoredGroups(
                    self.now + self.config.scoring_s,
                    task.oldest_version,
                    1,
                    w.index,
                    task.started_at_s,
                    task.tokens_by_version,
                )
            )
        self.worker_try_batch(w)

    def version_shares(self, w: SimWorker, row: Row) -> dict[int, float]:
        """The fraction of the row's tokens sampled with each version: the worker swaps in each newer version
        as it arrives, between two decoding steps, and a row decodes at a steady rate."""
        arrivals = []  # (arrival at w, version) of the versions newer than the row's start version
        for v in reversed(self.versions):
            if v.version <= row.version:
                break
            at_s = v.published_at_s + v.offsets.get(w.index, float("inf"))
            if row.started_at_s < at_s < self.now:
                arrivals.append((at_s, v.version))
        duration_s = self.now - row.started_at_s
        if not arrivals or duration_s <= 0:
            return {row.version: 1.0}
        shares: dict[int, float] = {}
        since_s, version = row.started_at_s, row.version
        for at_s, newer in sorted(arrivals):
            if newer > version:
                shares[version] = shares.get(version, 0.0) + (at_s - since_s) / duration_s
                since_s, version = at_s, newer
        shares[version] = shares.get(version, 0.0) + (self.now - since_s) / duration_s
        return shares

    def fail(self, w: SimWorker) -> None:
        if w.state == "dead":
            return
        rows = self.rows_of(w)
        lost = {*(row.task for row in rows.running.values()), *rows.queued}
        for task_id in lost:
            del self.tasks[task_id]
        self.rows[w.index] = WorkerRows()
        if lost:  # back on `tasks` once another worker claims them
            self.pending_reclaims[w.index] = self.pending_reclaims.get(w.index, 0) + len(lost)
            self.schedule(self.now + self.config.claim_idle_s, Kind.RECLAIM, w.index)
        w.busy, w.batch_groups = False, 0
        super().fail(w)

    def groups_in_flight(self) -> int:
        scored = sum(entry.num_groups for entry in self.scored)
        return self.pool + len(self.tasks) + sum(self.pending_reclaims.values()) + scored + self.freed

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id
