"""The capacity model (docs/design.md#the-capacity-model, derived in docs/capacity_model.md): how much rollout throughput keeps the learner busy, and
whether a staleness bound S can hold. Pure arithmetic: no I/O, no torch. The coordinator feeds it
measurements (GET /v1/capacity, cost-aware activation); the simulator feeds it its own.

Symbols (seconds unless said otherwise)
    R        samples per learner step (group_size * groups_per_step)
    T_train  optimizer step time (forward + backward + update): the learner's busy time per step
    T_over   the rest of a step when the learner never waits: publish, evaluation and checkpoint
             time amortised per step. C = T_train + T_over is the shortest possible step period.
    T_bcast  announcement of a version -> all but the f slowest active workers sample with it
             (f = max(1, n // 10) from n = 3: services/coordinator/broadcast_times.py)
    L_gen    one worker's latency for one batch of groups (start of generation -> groups published)
    D        scoring plus waiting in the queue before the learner reads a finished group
    mu_i     samples/s of worker i while it generates; M = sum(mu_i) over the active set
    k        publish_every; S the staleness bound; P the learner's actual step period (P >= C)

Throughput rule: the learner never starves only if M >= R / T_train (with overheads, R / C).

Freshness, exact discrete form. The learner reads the batch for step t+1 at the instant it starts
that step, at version t; steps start every P seconds, at a_t = t * P. Version v (a multiple of k) is
published when step v ends, at a_{v-1} + C, and every active worker samples with it from
a_{v-1} + C + T_bcast until version v+k arrives k*P later. Write a group's start as
tau = a_{v-1} + C + T_bcast + s with s in [0, k*P). It is published at tau + L_gen, readable D later,
and read by the first batch read at or after that:
    t_read   = ceil((tau + L_gen + D) / P) = (v - 1) + ceil((C + x + s) / P),   x = T_bcast + L_gen + D
    lag(s)   = t_read - v = ceil((C + x + s) / P) - 1
The worst group starts just before the next version arrives (s -> k*P):
    max_lag  = k - 1 + ceil((C + x) / P)             (ceil(y - eps) = ceil(y) for every real y)
Every group is admissible iff max_lag <= S. With a learner that never waits (P = C) this is
    k + ceil((T_bcast + L_gen + D) / C) <= S
which is DESIGN's "k + T_bcast/T_train + L_gen/T_train + queueing <= S" with the rounding made
exact: a group read one instant after a step boundary waits a whole step. S = 0 can never hold
with a busy learner (max_lag >= k >= 1): the synchronous baseline makes the learner wait.

Admissible share. A group started at s is admissible iff ceil((C + x + s) / P) - 1 <= S, i.e.
    s <= A(P) = (S + 1) * P - C - x.
If downloading version v+k stops a worker (`fetch_blocks_generation`: a worker that fetches weights
between batches), it loses T_bcast at the stale end of the cycle: only s in [0, k*P - T_bcast)
generate; a worker that fetches on its own thread while it samples (ours) generates for all k*P.
Admissible samples per cycle of k steps are M * min(k*P - b*T_bcast, A(P))^+ (b = 1 if blocking,
else 0) and must cover k*R:
    M * (k*P - b*T_bcast) >= k*R        with b = 1 the overlap form: T_bcast + k*R/M <= k*P
    M * ((S+1)*P - C - x) >= k*R        the freshness limit on the period
Both sides grow with P, so the predicted period is the smallest P that satisfies them:
    P* = max(C, R/M + b*T_bcast/k, (k*R/M + C + x) / (S + 1))
and the predicted learner utilization (busy share of wall time) is T_train / P*.
S = 0, k = 1 gives P* = C + T_bcast + L_gen + D + R/M: the synchronous baseline, nothing overlaps.

Not modelled: the data plane's bound on groups in flight. With S <= 1 it holds one batch, and the
groups sampled in the T_bcast after a publication arrive one step too old and must be replaced
while the learner waits; the simulator (which does model it) is the predictor there.

The model is a fluid one (a worker's samples are spread over its batch) and worst-case on
freshness (T_bcast is the fleet's 90% quantile, L_gen its slowest worker's). docs/capacity_model.md walks through it with numbers;
tests/unit/test_capacity_model.py checks max_lag and the admissible share against a step-by-step
simulation of the timeline above.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

# ceil of a ratio computed in floating point: 3.0000000000000004 must count as 3
_CEIL_TOLERANCE = 1e-9


# a ratio beyond this (or non-finite: a measurement of 1e308 once made math.ceil raise OverflowError on
# every control pass) counts as this; lags and bounds this large mean "never" all the same
MAX_CEIL_RATIO = 2**31


def ceil_ratio(numerator: float, denominator: float) -> int:
    ratio = numerator / denominator - _CEIL_TOLERANCE
    if not -MAX_CEIL_RATIO < ratio < MAX_CEIL_RATIO:  # NaN fails too
        return -MAX_CEIL_RATIO if ratio < 0 else MAX_CEIL_RATIO
    return math.ceil(ratio)


# A worker's self-reported rate (samples/s, a group latency) counts at most this many times the fleet's
# low median: one worker claiming 1e6 samples/s would otherwise cover any target on its own
MAX_RATIO_TO_MEDIAN = 4.0


def capped_at_median(values: Mapping[str, float], ratio: float = MAX_RATIO_TO_MEDIAN) -> dict[str, float]:
    """Each value capped at `ratio` x the low median of the positive values (median_low: of two, the
    smaller, so one liar beside one honest worker is capped too; a single value is its own median).

    Bound: with f < n/2 of n workers lying, the low median lies within the honest values' range, so
    each liar adds at most ratio x (the largest honest value) to a sum, and a maximum is at most
    ratio x that too; honest values within ratio x the median are unchanged."""
    positive = [v for v in values.values() if v > 0]
    if not positive:
        return dict(values)
    cap = ratio * statistics.median_low(positive)
    return {name: min(value, cap) for name, value in values.items()}


@dataclass(frozen=True)
class CapacityInputs:
    """Everything the model needs, measured or assumed. Times in seconds."""

    samples_per_step: int  # R
    train_s: float  # T_train, mean optimizer step time
    staleness_bound: int  # S
    publish_every: int = 1  # k
    step_overhead_s: float = 0.0  # T_over: publish + eval + checkpoint per step when never idle
    broadcast_s: float = 0.0  # T_bcast
    group_latency_s: float = 0.0  # L_gen
    queue_delay_s: float = 0.0  # D
    worker_samples_per_s: tuple[float, ...] = ()  # mu_i of the active workers
    fetch_blocks_generation: bool = False  # True: a worker samples nothing while it downloads a version

    def __post_init__(self) -> None:
        if self.samples_per_step < 1:
            raise ValueError(f"samples_per_step must be >= 1, got {self.samples_per_step}")
        if self.train_s <= 0:
            raise ValueError(f"train_s must be > 0, got {self.train_s}")
        if self.staleness_bound < 0 or self.publish_every < 1:
            raise ValueError(
                f"need staleness_bound >= 0 and publish_every >= 1, got {self.staleness_bound}, {self.publish_every}"
            )
        for name in ("step_overhead_s", "broadcast_s", "group_latency_s", "queue_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if any(mu < 0 for mu in self.worker_samples_per_s):
            raise ValueError("worker throughputs must be >= 0")

    @property
    def min_step_s(self) -> float:
        """C: the step period of a learner that never waits for rollouts."""
        return self.train_s + self.step_overhead_s

    @property
    def total_samples_per_s(self) -> float:
        """M = sum(mu_i)."""
        return sum(self.worker_samples_per_s)

    @property
    def lag_window_s(self) -> float:
        """x = T_bcast + L_gen + D: how long after its publication a version's groups keep arriving."""
        return self.broadcast_s + self.group_latency_s + self.queue_delay_s


# the rules, one function each
def required_samples_per_s(samples_per_step: int, train_s: float) -> float:
    """Throughput rule: sum(mu_i) >= R / T_train."""
    return samples_per_step / train_s


def overlap_required_samples_per_s(
    samples_per_step: int, train_s: float, broadcast_s: float, publish_every: int
) -> float:
    """Overlap form: T_bcast + k*R/M <= k*T_train, i.e. M >= k*R / (k*T_train - T_bcast). Infinite when
    T_bcast >= k*T_train: no throughput can hide a broadcast longer than the publish window."""
    window_s = publish_every * train_s - broadcast_s
    return publish_every * samples_per_step / window_s if window_s > 0 else math.inf


def max_lag_steps(step_period_s: float, min_step_s: float, lag_window_s: float, publish_every: int) -> int:
    """The largest t - v of any group read by a learner with step period P (exact discrete form):
    k - 1 + ceil((C + x) / P)."""
    return publish_every - 1 + ceil_ratio(min_step_s + lag_window_s, step_period_s)


def min_feasible_staleness(inputs: CapacityInputs) -> int:
    """The smallest S at which a learner that never waits trains on every group: k + ceil(x / C)."""
    return max_lag_steps(inputs.min_step_s, inputs.min_step_s, inputs.lag_window_s, inputs.publish_every)


def admissible_window_s(inputs: CapacityInputs, step_period_s: float) -> float:
    """Per cycle of k steps: the seconds of generation start times whose groups are admissible and not
    lost to downloading, min(k*P - T_bcast, (S+1)*P - C - x)^+."""
    k = inputs.publish_every
    generating_s = k * step_period_s - (inputs.broadcast_s if inputs.fetch_blocks_generation else 0.0)
    fresh_s = (inputs.staleness_bound + 1) * step_period_s - inputs.min_step_s - inputs.lag_window_s
    return max(0.0, min(generating_s, fresh_s))


def predicted_step_s(inputs: CapacityInputs) -> float:
    """P* = max(C, R/M + b*T_bcast/k, (k*R/M + C + x) / (S + 1)); infinite without throughput."""
    total = inputs.total_samples_per_s
    if total <= 0:
        return math.inf
    k, r = inputs.publish_every, inputs.samples_per_step
    blocked_s = inputs.broadcast_s if inputs.fetch_blocks_generation else 0.0
    return max(
        inputs.min_step_s,
        r / total + blocked_s / k,
        (k * r / total + inputs.min_step_s + inputs.lag_window_s) / (inputs.staleness_bound + 1),
    )


@dataclass(frozen=True)
class CapacityAssessment:
    required_samples_per_s: float  # throughput rule R / T_train
    overlap_required_samples_per_s: float  # overlap form k*R / (k*T_train - T_bcast)
    provisioning_samples_per_s: float  # what activation provisions for: max of the two rules with overheads
    current_samples_per_s: float  # M
    predicted_step_s: float  # P*
    predicted_utilization: float  # T_train / P*
    max_lag_steps: int  # at P*
    min_feasible_staleness: int  # k + ceil(x / C)
    staleness_feasible: bool  # a learner that never waits trains on every group at this S
    admissible_fraction: float  # share of generated groups that arrive admissible at P*
    starved: bool  # throughput below what keeps the learner from waiting


def provisioning_samples_per_s(inputs: CapacityInputs) -> float:
    """The throughput that runs the learner at its shortest period C: the throughput rule R / C, the
    overlap form at P = C when fetching blocks generation, and the freshness limit M >= k*R / (S*C - x),
    each where it is finite. Where no throughput can satisfy one (T_bcast >= k*C, or S*C <= x: the
    learner must wait whatever the workers do) it is left out, so the target stays finite."""
    k, r, c = inputs.publish_every, inputs.samples_per_step, inputs.min_step_s
    needs = [r / c]
    if inputs.fetch_blocks_generation:
        needs.append(overlap_required_samples_per_s(r, c, inputs.broadcast_s, k))
    fresh_s = inputs.staleness_bound * c - inputs.lag_window_s
    if fresh_s > 0:
        needs.append(k * r / fresh_s)
    return max(need for need in needs if math.isfinite(need))


def assess(inputs: CapacityInputs) -> CapacityAssessment:
    step_s = predicted_step_s(inputs)
    total = inputs.total_samples_per_s
    if math.isfinite(step_s):
        generated_s = inputs.publish_every * step_s - (inputs.broadcast_s if inputs.fetch_blocks_generation else 0.0)
        fraction = admissible_window_s(inputs, step_s) / generated_s if generated_s > 0 else 0.0
        lag = max_lag_steps(step_s, inputs.min_step_s, inputs.lag_window_s, inputs.publish_every)
    else:
        fraction, lag = 0.0, 0
    provisioning = provisioning_samples_per_s(inputs)
    return CapacityAssessment(
        required_samples_per_s=required_samples_per_s(inputs.samples_per_step, inputs.train_s),
        overlap_required_samples_per_s=overlap_required_samples_per_s(
            inputs.samples_per_step, inputs.train_s, inputs.broadcast_s, inputs.publish_every
        ),
        provisioning_samples_per_s=provisioning,
        current_samples_per_s=total,
        predicted_step_s=step_s,
        predicted_utilization=inputs.train_s / step_s if math.isfinite(step_s) else 0.0,
        max_lag_steps=lag,
        min_feasible_staleness=min_feasible_staleness(inputs),
        staleness_feasible=min_feasible_staleness(inputs) <= inputs.staleness_bound,
        admissible_fraction=fraction,
        starved=step_s > inputs.min_step_s * (1 + 1e-9),
    )
