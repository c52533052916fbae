"""Discrete-event simulation of one run: learner, data plane, heterogeneous workers, broadcast, coordinator.

It mirrors the real services' rules, so its learner utilization can be checked against real runs:
- data plane: at most M groups in flight (tasks + generating + scoring + scored unread); a slot is
  refilled when the learner reads a group (services/reward/task_feed.py);
- worker: between batches it swaps in the newest version it holds, checks the staleness gate
  (t - v <= S), takes up to `max_groups_per_batch` tasks and generates them in one call lasting
  `call_overhead_s + groups * G / mu_i`; standby workers take no tasks (services/rollout/worker.py);
- learner: reads groups in arrival order, drops those with t - v > S, trains once it has B admitted
  groups (T_train + T_over), publishes every k steps (services/learner/learner.py);
- broadcast: each live worker holds version v at publication + its relay-tree time (simulator/relay.py),
  or a fixed T_bcast when one is given (validation against measured runs);
- failures: a failed worker's batch is lost; its tasks return after `claim_idle_s` (XAUTOCLAIM) and the
  coordinator learns of the death after `lease_s`; a replacement joins later;
- coordinator: every `replan_interval_s` (and on joins and deaths) it runs shared.activation on the
  measured throughputs with the requirement from shared.capacity, exactly as services/coordinator/
  control.py does; cost is billed while a worker is active (the ledger's rule) plus the learner.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import IntEnum

from shared.activation import ActivationPolicy, Candidate, plan_activation
from shared.capacity import CapacityAssessment, CapacityInputs, assess, provisioning_samples_per_s
from shared.staleness import AdmissionRule, max_trained_token_lag
from simulator.fleet import FleetSampler, WorkerSpec
from simulator.read_stats import ReadStats, ScoredGroups
from simulator.relay import RelayNode, broadcast_offsets


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Times in seconds."""

    group_size: int  # G
    groups_per_step: int  # B; R = G * B
    num_steps: int
    train_s: float  # T_train (mean)
    staleness_bound: int  # S
    publish_every: int = 1  # k
    step_overhead_s: float = 0.0  # T_over: publish, eval, checkpoint per step
    batch_read_s: float = 0.0  # learner time to read and decode a full batch (the real learner counts it as idle)
    train_s_sigma: float = 0.0  # log-normal jitter of T_train
    max_groups_in_flight: int = 0  # M; 0: B * max(1, S - 1) as RunConfig.max_groups_in_flight
    max_groups_per_batch: int = 16
    call_overhead_s: float = 0.0  # fixed cost of one worker loop turn + engine call
    scoring_s: float = 0.01  # reward service: a published group is readable by the learner this much later
    reward_poll_s: float = 0.0  # reward loop: top up after scoring, or after this long idle; 0: top up at once
    trickle_tasks: bool = False  # tasks are published one by one: a waiting worker wakes with the first alone
    payload_bytes: float = 0.0  # per version
    chunk_bytes: float = 4 << 20
    learner_uplink_mbps: float = 10_000.0
    relay_num_seeds: int = 4
    relay_fanout: int = 2
    fixed_broadcast_s: float | None = None  # every worker gets each version after exactly this long
    claim_idle_s: float = 15.0
    lease_s: float = 5.0
    replan_interval_s: float = 5.0
    activation: ActivationPolicy | None = None  # None: every live worker active
    learner_price_per_hour: float = 0.0
    measurement_noise: float = 0.05  # relative error of a worker's measured throughput
    max_sim_s: float = 1e7
    seed: int = 0
    # Worker batching (docs/continuous_batching.md): "batch" runs a call of up to max_groups_per_batch groups;
    # "continuous" keeps max_groups_per_batch * G rows decoding, each sample a row (simulator/continuous.py).
    batching: str = "batch"
    # Sample lengths as multiples of their mean (empty: every sample the mean). A batch call lasts as long as
    # its longest sample; a continuous row as long as its own.
    length_factors: tuple[float, ...] = ()
    continuous_max_rows: int = 0  # continuous: rows a worker decodes together; 0: max_groups_per_batch * G
    # continuous: lease new tasks only while holding the newest published version (rows in flight go on);
    # False, as services/rollout/continuous.py: lease whenever the staleness gate is open
    lease_newest_only: bool = False
    # which version of a continuous group S bounds (shared/staleness.py): its oldest token's, or its newest's
    admission: AdmissionRule = "oldest_token"

    @property
    def samples_per_step(self) -> int:
        return self.group_size * self.groups_per_step

    @property
    def groups_in_flight(self) -> int:
        return self.max_groups_in_flight or self.groups_per_step * max(1, self.staleness_bound - 1)


@dataclass
class SimResult:
    num_steps: int
    wall_s: float
    train_s_total: float
    utilization: float  # sum(T_train) / wall
    num_dropped_stale: int
    staleness_histogram: dict[int, int]
    cost_usd: float
    learner_usd: float
    workers_usd: float
    mean_active_workers: float
    mean_broadcast_s: float  # over versions: the last active worker's arrival
    num_failures: int
    num_joins: int
    num_events: int
    runtime_s: float
    predicted: CapacityAssessment | None  # shared.capacity on the run's own measured inputs
    usd_per_step: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)
    # what the learner read (simulator/read_stats.py)
    num_trained_groups: int = 0
    mean_group_age_s: float = 0.0  # a trained group's read time - its call's start or its lease
    dropped_token_fraction: float = 0.0  # of the tokens read (in mean-length samples)
    token_lag_histogram: dict[int, float] = field(default_factory=dict)  # trained tokens' lags, fractions
    worker_groups: dict[str, int] = field(default_factory=dict)  # groups scored, by worker id
    worker_dropped: dict[str, int] = field(default_factory=dict)  # groups dropped as stale, by worker id


PERIODIC, REQUESTED = -1, -2  # the two kinds of REPLAN event


class Kind(IntEnum):
    STEP_DONE = 0
    BATCH_DONE = 1
    SCORED = 2
    WAKE = 3
    FAIL = 4
    JOIN = 5
    DEATH_DETECTED = 6
    RECLAIM = 7
    REPLAN = 8
    REWARD_TICK = 9


@dataclass
class SimWorker:
    spec: WorkerSpec
    index: int
    state: str = "active"  # active | standby | dead
    busy: bool = False
    waiting_for_weights: bool = False
    batch_groups: int = 0
    batch_version: int = -1
    batch_token: int = 0  # invalidates a BATCH_DONE scheduled before a failure
    measured_mu: float = 0.0
    batch_latency_s: float = 0.0
    state_since_s: float = 0.0
    active_since_s: float | None = None
    billed_s: float = 0.0
    late_version: tuple[int, float] | None = None  # (version, arrival) fetched on joining


@dataclass
class Version:
    version: int
    published_at_s: float
    offsets: dict[int, float]  # worker index -> seconds until it holds this version


class Simulation:
    def __init__(self, config: SimConfig, workers: list[WorkerSpec], sampler: FleetSampler | None = None) -> None:
        self.config = config
        self.sampler = sampler  # draws replacements after failures; None: failed workers are not replaced
        self.rng = random.Random(config.seed)
        self.events: list[tuple[float, int, Kind, int, int]] = []  # (at, seq, kind, worker index or -1, token)
        self.seq = 0
        self.now = 0.0
        self.workers: list[SimWorker] = []
        self.versions: list[Version] = []
        # data plane
        self.pool = config.groups_in_flight  # tasks waiting in the tasks stream
        self.scored: deque[ScoredGroups] = deque()  # in arrival order
        self.read_stats = ReadStats(config.group_size, max_trained_token_lag(config.admission, config.staleness_bound))
        self.idle_workers: deque[int] = deque()
        self.idle_set: set[int] = set()
        self.pending_reclaims: dict[int, int] = {}
        self.freed = 0  # task slots freed by learner reads, not yet topped up by the reward loop
        self.reward_tick_token = 0
        # learner
        self.learner_version = 0
        self.learner_busy = False
        self.batch_count = 0
        self.batch_lags: Counter[int] = Counter()
        self.train_s_total = 0.0
        self.step_train_s: list[float] = []
        self.step_ended_at_s: list[float] = []
        self.staleness = Counter()
        self.num_dropped = 0
        self.done_at_s: float | None = None
        # bookkeeping
        self.broadcast_s: list[float] = []
        self.active_integral = 0.0
        self.last_active_change_s = 0.0
        self.num_active = 0
        self.num_failures = 0
        self.num_joins = 0
        self.num_events = 0
        self.replan_pending = False
        for spec in workers:
            self.schedule(spec.joins_at_s, Kind.JOIN, self.add_worker(spec))

    # the loop
    def run(self) -> SimResult:
        started = time.perf_counter()
        self.publish(0)
        self.schedule(0.0, Kind.REPLAN, PERIODIC)
        self.reward_tick()
        while self.events and self.done_at_s is None:
            at_s, _, kind, arg, token = heapq.heappop(self.events)
            if at_s > self.config.max_sim_s:
                break
            self.now = at_s
            self.num_events += 1
            self.handle(kind, arg, token)
        return self.result(time.perf_counter() - started)

    def handle(self, kind: Kind, arg: int, token: int) -> None:
        if kind == Kind.STEP_DONE:
            self.finish_step()
        elif kind == Kind.BATCH_DONE:
            self.finish_batch(self.workers[arg], token)
        elif kind == Kind.SCORED:  # the reward loop published a batch's scored groups, then tops up
            self.reward_tick()
            self.learner_try_step()
        elif kind == Kind.WAKE:
            self.worker_try_batch(self.workers[arg])
        elif kind == Kind.FAIL:
            self.fail(self.workers[arg])
        elif kind == Kind.JOIN:
            self.join(self.workers[arg])
        elif kind == Kind.DEATH_DETECTED:  # the lease ran out: the coordinator re-plans without it
            self.request_replan()
        elif kind == Kind.RECLAIM:
            self.add_tasks(self.pending_reclaims.pop(arg, 0))
        elif kind == Kind.REWARD_TICK:
            if arg == self.reward_tick_token:  # an idle read block ran out (a newer tick supersedes it)
                self.reward_tick()
        elif kind == Kind.REPLAN:
            self.replan()
            if arg == PERIODIC:
                self.schedule(self.now + self.config.replan_interval_s, Kind.REPLAN, PERIODIC)

    def schedule(self, at_s: float, kind: Kind, arg: int, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at_s, self.seq, kind, arg, token))

    # workers
    def add_worker(self, spec: WorkerSpec) -> int:
        self.workers.append(SimWorker(spec, len(self.workers), state="dead"))
        return len(self.workers) - 1

    def join(self, w: SimWorker) -> None:
        self.num_joins += 1
        newest = self.versions[-1] if self.versions else None
        if newest is not None:  # a late joiner fetches the newest version whole, from the learner or a holder
            w.late_version = (newest.version, self.now + self.config.payload_bytes * 8 / (w.spec.bandwidth_mbps * 1e6))
        # like the coordinator: active unless activation says otherwise at the next pass
        self.set_state(w, "active" if self.config.activation is None else "standby")
        if math.isfinite(w.spec.fails_after_s):
            self.schedule(self.now + w.spec.fails_after_s, Kind.FAIL, w.index)
        self.request_replan()
        self.worker_try_batch(w)

    def fail(self, w: SimWorker) -> None:
        if w.state == "dead":
            return
        self.num_failures += 1
        if w.busy:  # the batch is lost; its tasks stay pending until another worker claims them
            self.pending_reclaims[w.index] = w.batch_groups
            self.schedule(self.now + self.config.claim_idle_s, Kind.RECLAIM, w.index)
            w.busy, w.batch_groups = False, 0
            w.batch_token += 1
        self.set_state(w, "dead")
        self.schedule(self.now + self.config.lease_s, Kind.DEATH_DETECTED, w.index)
        if self.sampler is not None:
            self.schedule(
                self.now + self.sampler.rejoin_delay_s(), Kind.JOIN, self.add_worker(self.sampler.draw(self.now))
            )

    def set_state(self, w: SimWorker, state: str) -> None:
        if state == w.state:
            return
        self.account_active()
        if w.state == "active":
            self.num_active -= 1
            w.billed_s += self.now - (w.active_since_s or self.now)
            w.active_since_s = None
        if state == "active":
            self.num_active += 1
            w.active_since_s = self.now
        w.state, w.state_since_s = state, self.now

    def held_version(self, w: SimWorker) -> int:
        for v in reversed(self.versions):
            offset = v.offsets.get(w.index)
            if offset is not None and v.published_at_s + offset <= self.now:
                return v.version
            if w.late_version is not None and w.late_version[0] == v.version and w.late_version[1] <= self.now:
                return v.version
        return -1

    def next_arrival_s(self, w: SimWorker, held: int) -> float | None:
        arrivals = [
            v.published_at_s + v.offsets[w.index] for v in self.versions if v.version > held and w.index in v.offsets
        ]
        if w.late_version is not None and w.late_version[0] > held:
            arrivals.append(w.late_version[1])
        future = [a for a in arrivals if a > self.now]
        return min(future) if future else None

    def worker_try_batch(self, w: SimWorker) -> None:
        if w.state != "active" or w.busy:
            return
        held = self.held_version(w)
        if held < 0 or self.learner_version - held > self.config.staleness_bound:  # no weights, or the gate is closed
            arrival = self.next_arrival_s(w, held)
            if arrival is not None:
                self.schedule(arrival, Kind.WAKE, w.index)
            else:
                w.waiting_for_weights = True
            return
        if self.pool <= 0:
            if w.index not in self.idle_set:
                self.idle_set.add(w.index)
                self.idle_workers.append(w.index)
            return
        num_groups = min(self.config.max_groups_per_batch, self.pool)
        self.pool -= num_groups
        num_rows = num_groups * self.config.group_size
        latency_s = self.config.call_overhead_s + num_rows / w.spec.samples_per_s * self.longest_of(num_rows)
        w.busy, w.batch_groups, w.batch_version, w.batch_latency_s = True, num_groups, held, latency_s
        w.batch_token += 1
        self.schedule(self.now + latency_s, Kind.BATCH_DONE, w.index, w.batch_token)

    def longest_of(self, num_samples: int) -> float:
        """The length factor of the longest of `num_samples` samples (1 without length_factors)."""
        factors = self.config.length_factors
        return max(self.rng.choices(factors, k=num_samples)) if factors else 1.0

    def finish_batch(self, w: SimWorker, token: int) -> None:
        if not w.busy or w.batch_token != token:
            return  # the worker failed meanwhile
        num_groups = w.batch_groups
        w.busy, w.batch_groups = False, 0
        noise = 1 + self.rng.uniform(-self.config.measurement_noise, self.config.measurement_noise)
        w.measured_mu = num_groups * self.config.group_size / w.batch_latency_s * noise
        self.publish_scored(
            ScoredGroups(
                self.now + self.config.scoring_s, w.batch_version, num_groups, w.index, self.now - w.batch_latency_s
            )
        )
        self.worker_try_batch(w)

    def publish_scored(self, entry: ScoredGroups) -> None:
        self.scored.append(entry)
        self.read_stats.scored(entry)
        self.schedule(entry.readable_at_s, Kind.SCORED, -1)

    def reward_tick(self) -> None:
        """One turn of the reward loop: top up the freed slots, then block up to reward_poll_s for rollouts."""
        if self.config.reward_poll_s <= 0:
            return
        num_tasks, self.freed = self.freed, 0
        if num_tasks and self.config.trickle_tasks and self.idle_workers:
            self.add_tasks(1)  # the first XADD wakes a blocked worker, which reads that one task
            num_tasks -= 1
        self.add_tasks(num_tasks)
        self.reward_tick_token += 1
        self.schedule(self.now + self.config.reward_poll_s, Kind.REWARD_TICK, self.reward_tick_token)

    def add_tasks(self, num_tasks: int) -> None:
        self.pool += num_tasks
        while self.pool > 0 and self.idle_workers:
            index = self.idle_workers.popleft()
            self.idle_set.discard(index)
            self.worker_try_batch(self.workers[index])

    # learner
    def learner_try_step(self) -> None:
        if self.learner_busy or self.done_at_s is not None:
            return
        config = self.config
        num_read = 0
        while self.scored and self.scored[0].readable_at_s <= self.now and self.batch_count < config.groups_per_step:
            entry = self.scored[0]
            lag = self.learner_version - entry.policy_version
            bounded = entry.policy_version
            if config.admission == "per_token" and entry.tokens_by_version:
                bounded = max(entry.tokens_by_version)
            dropped = self.learner_version - bounded > config.staleness_bound
            if dropped:
                take = entry.num_groups
                self.num_dropped += take
            else:
                take = min(entry.num_groups, config.groups_per_step - self.batch_count)
                self.batch_count += take
                self.batch_lags[lag] += take
            self.read_stats.read(entry, take, self.learner_version, self.now, dropped)
            entry.num_groups -= take
            num_read += take
            if entry.num_groups == 0:
                self.scored.popleft()
        if config.reward_poll_s > 0:
            self.freed += num_read  # topped up at the reward loop's next turn
        else:
            self.add_tasks(num_read)
        if self.batch_count >= config.groups_per_step:
            self.batch_count = 0
            self.staleness.update(self.batch_lags)
            self.batch_lags = Counter()
            train_s = config.train_s * (
                math.exp(self.rng.gauss(0, config.train_s_sigma)) if config.train_s_sigma else 1.0
            )
            self.train_s_total += train_s
            self.step_train_s.append(train_s)
            self.learner_busy = True
            self.schedule(self.now + config.batch_read_s + train_s + config.step_overhead_s, Kind.STEP_DONE, -1)

    def finish_step(self) -> None:
        self.learner_busy = False
        self.learner_version += 1
        self.step_ended_at_s.append(self.now)
        if self.learner_version >= self.config.num_steps:
            self.done_at_s = self.now
            return
        if self.learner_version % self.config.publish_every == 0:
            self.publish(self.learner_version)
        self.learner_try_step()

    def publish(self, version: int) -> None:
        live = [w for w in self.workers if w.state != "dead"]
        if self.config.fixed_broadcast_s is not None:
            offsets = {w.index: self.config.fixed_broadcast_s for w in live}
        else:
            nodes = [RelayNode(w.index, w.spec.bandwidth_mbps, w.spec.latency_s, w.state == "active") for w in live]
            offsets = broadcast_offsets(
                nodes,
                payload_bytes=self.config.payload_bytes,
                chunk_bytes=self.config.chunk_bytes,
                learner_uplink_mbps=self.config.learner_uplink_mbps,
                num_seeds=self.config.relay_num_seeds,
                fanout=self.config.relay_fanout,
            )
        self.versions.append(Version(version, self.now, offsets))
        active_offsets = [offsets[w.index] for w in live if w.state == "active"]
        if active_offsets:
            self.broadcast_s.append(max(active_offsets))
        for w in live:
            if w.waiting_for_weights:
                w.waiting_for_weights = False
                self.schedule(self.now + offsets[w.index], Kind.WAKE, w.index)

    # coordinator
    def request_replan(self) -> None:
        """Membership changed: one pass at the current time, however many changes arrive at once."""
        if self.config.activation is not None and not self.replan_pending:
            self.replan_pending = True
            self.schedule(self.now, Kind.REPLAN, REQUESTED)

    def replan(self) -> None:
        self.replan_pending = False
        if self.config.activation is None:
            return
        candidates = [
            Candidate(
                w.spec.worker_id,
                w.spec.price_per_hour,
                w.measured_mu,
                w.spec.gpu_type,
                w.state == "active",
                w.state_since_s,
            )
            for w in self.workers
            if w.state != "dead"
        ]
        inputs = self.measured_inputs()
        required = provisioning_samples_per_s(inputs) if inputs is not None else None
        plan = plan_activation(candidates, required, self.config.activation, self.now)
        by_id = {w.spec.worker_id: w for w in self.workers}
        for worker_id in plan.active_ids:
            w = by_id[worker_id]
            if w.state == "standby":
                self.set_state(w, "active")
                self.worker_try_batch(w)
        for worker_id in plan.standby_ids:
            w = by_id[worker_id]
            if w.state == "active":
                self.set_state(w, "standby")

    def measured_inputs(self) -> CapacityInputs | None:
        """What the coordinator would measure now (None before the first step)."""
        if not self.step_train_s:
            return None
        c = self.config
        active = [w for w in self.workers if w.state == "active"]
        recent = self.step_train_s[-20:]
        queued = sum(entry.num_groups for entry in self.scored)
        return CapacityInputs(
            samples_per_step=c.samples_per_step,
            train_s=statistics.fmean(recent),
            staleness_bound=c.staleness_bound,
            publish_every=c.publish_every,
            step_overhead_s=c.step_overhead_s,
            broadcast_s=statistics.fmean(self.broadcast_s[-10:]) if self.broadcast_s else 0.0,
            group_latency_s=max((w.batch_latency_s for w in active if w.measured_mu > 0), default=0.0),
            queue_delay_s=max(0, queued - c.groups_per_step)
            / c.groups_per_step
            * (statistics.fmean(recent) + c.step_overhead_s),
            worker_samples_per_s=tuple(w.measured_mu for w in active if w.measured_mu > 0),
        )

    def groups_in_flight(self) -> int:
        """Tasks waiting + being generated + held by dead consumers + scored and unread: the data plane keeps
        this at M, so it also shows that no task was lost."""
        generating = sum(w.batch_groups for w in self.workers if w.busy)
        scored = sum(entry.num_groups for entry in self.scored)
        return self.pool + generating + sum(self.pending_reclaims.values()) + scored + self.freed

    # results
    def account_active(self) -> None:
        self.active_integral += self.num_active * (self.now - self.last_active_change_s)
        self.last_active_change_s = self.now

    def result(self, runtime_s: float) -> SimResult:
        self.account_active()
        wall_s = self.now
        for w in self.workers:
            if w.active_since_s is not None:
                w.billed_s += wall_s - w.active_since_s
                w.active_since_s = wall_s
        workers_usd = sum(w.billed_s * w.spec.price_per_hour for w in self.workers) / 3600
        learner_usd = wall_s * self.config.learner_price_per_hour / 3600
        inputs = self.measured_inputs()
        num_steps = self.learner_version
        return SimResult(
            num_steps=num_steps,
            wall_s=wall_s,
            train_s_total=self.train_s_total,
            utilization=self.train_s_total / wall_s if wall_s > 0 else 0.0,
            num_dropped_stale=self.num_dropped,
            staleness_histogram=dict(sorted(self.staleness.items())),
            cost_usd=learner_usd + workers_usd,
            learner_usd=learner_usd,
            workers_usd=workers_usd,
            mean_active_workers=self.active_integral / wall_s if wall_s > 0 else 0.0,
            mean_broadcast_s=statistics.fmean(self.broadcast_s) if self.broadcast_s else 0.0,
            num_failures=self.num_failures,
            num_joins=self.num_joins,
            num_events=self.num_events,
            runtime_s=runtime_s,
            predicted=assess(inputs) if inputs is not None else None,
            usd_per_step=(learner_usd + workers_usd) / max(1, num_steps),
            num_trained_groups=self.read_stats.num_trained_groups,
            mean_group_age_s=self.read_stats.mean_age_s,
            dropped_token_fraction=self.read_stats.dropped_token_fraction,
            token_lag_histogram=self.read_stats.token_lag_fractions(),
            worker_groups={w.spec.worker_id: self.read_stats.groups_by_worker[w.index] for w in self.workers},
            worker_dropped={w.spec.worker_id: self.read_stats.dropped_by_worker[w.index] for w in self.workers},
        )


def simulate(config: SimConfig, workers: list[WorkerSpec], sampler: FleetSampler | None = None) -> SimResult:
    if config.batching == "continuous":
        from simulator.continuous import ContinuousSimulation

        return ContinuousSimulation(config, workers, sampler).run()
    return Simulation(config, workers, sampler).run()
