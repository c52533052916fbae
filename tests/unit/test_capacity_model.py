"""shared/capacity.py: the rules, and the exact discrete freshness form checked against a step-by-step
simulation of the timeline it is derived from (exact rational arithmetic, boundaries included)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from shared.capacity import (
    MAX_RATIO_TO_MEDIAN,
    CapacityInputs,
    admissible_window_s,
    assess,
    capped_at_median,
    max_lag_steps,
    min_feasible_staleness,
    overlap_required_samples_per_s,
    predicted_step_s,
    provisioning_samples_per_s,
    required_samples_per_s,
)

EPS = Fraction(1, 10**9)


def timeline_lags(
    period: Fraction,
    min_step: Fraction,
    broadcast: Fraction,
    latency: Fraction,
    queue: Fraction,
    k: int,
    start_times: list[Fraction],
    fetch_blocks: bool,
) -> list[int]:
    """The docstring's timeline, literally: step t+1 starts (and reads its batch) at t * P; version v
    (a multiple of k) is published at (v - 1) * P + C and every worker holds it T_bcast later; a group
    started at tau with the newest version held is read by the first batch read at or after
    tau + L_gen + D. With `fetch_blocks`, a worker downloading the next version starts nothing."""
    lags = []
    for tau in start_times:
        held = None
        for v in range(k, 10_000, k):
            published = (v - 1) * period + min_step
            if published + broadcast <= tau:
                held = v
            else:
                if fetch_blocks and published <= tau:
                    held = None  # downloading v: not generating
                break
        if held is None:
            continue
        read_at = math.ceil((tau + latency + queue) / period)
        lags.append(read_at - held)
    return lags


def start_time_grid(
    period: Fraction,
    k: int,
    min_step: Fraction,
    broadcast: Fraction,
    latency: Fraction,
    queue: Fraction,
    num_points: int,
) -> list[Fraction]:
    """A dense grid over whole cycles in steady state (the lags repeat every k*P), plus every boundary
    approached from both sides."""
    begin = (3 * k - 1) * period + min_step + broadcast  # version 3k arrives
    end = begin + 6 * k * period
    grid = [begin + (end - begin) * i / num_points for i in range(num_points)]
    edges = []
    for v in range(k, 12 * k, k):
        edges.append((v - 1) * period + min_step + broadcast)  # arrival of v
        edges.append((v - 1) * period + min_step)  # publication of v
    for t in range(30):
        edges.append(t * period - latency - queue)  # last start read by the batch of step t + 1
    boundaries = [e + d for e in edges for d in (-EPS, Fraction(0), EPS) if begin <= e + d < end]
    return grid + boundaries


def random_case(rng: random.Random) -> dict:
    def frac(low: int, high: int) -> Fraction:
        return Fraction(rng.randint(low, high), rng.choice([1, 2, 4, 5, 10]))

    min_step = frac(5, 40)
    period = min_step + (frac(0, 20) if rng.random() < 0.5 else 0)
    return {
        "period": period,
        "min_step": min_step,
        "broadcast": frac(0, 30),
        "latency": frac(0, 30),
        "queue": frac(0, 10),
        "k": rng.choice([1, 1, 2, 3]),
    }


@pytest.mark.parametrize("seed", range(24))
def test_max_lag_formula_equals_the_simulated_timeline(seed: int) -> None:
    case = random_case(random.Random(seed))
    # force exact integer ratios sometimes: the ceil boundary is where an approximate formula goes wrong
    if seed % 4 == 0:
        case["latency"] = case["period"] * 2 - case["broadcast"] - case["queue"] - case["min_step"] + case["period"]
        case["latency"] = max(case["latency"], Fraction(0))
    starts = start_time_grid(
        case["period"], case["k"], case["min_step"], case["broadcast"], case["latency"], case["queue"], 300
    )
    lags = timeline_lags(**case, start_times=starts, fetch_blocks=False)
    x = case["broadcast"] + case["latency"] + case["queue"]
    assert max(lags) == max_lag_steps(float(case["period"]), float(case["min_step"]), float(x), case["k"])


@pytest.mark.parametrize("seed", range(16))
def test_admissible_share_equals_the_simulated_timeline(seed: int) -> None:
    rng = random.Random(1000 + seed)
    case = random_case(rng)
    staleness_bound = rng.randint(0, 4)
    fetch_blocks = seed % 2 == 0
    num_points = 2000
    starts = start_time_grid(
        case["period"], case["k"], case["min_step"], case["broadcast"], case["latency"], case["queue"], num_points
    )
    starts = starts[:num_points]  # the uniform grid only: a share, not a maximum
    lags = timeline_lags(**case, start_times=starts, fetch_blocks=fetch_blocks)
    total_starts = len(starts)
    simulated = sum(1 for lag in lags if lag <= staleness_bound) / total_starts
    inputs = CapacityInputs(
        samples_per_step=64,
        train_s=float(case["min_step"]),
        staleness_bound=staleness_bound,
        publish_every=case["k"],
        broadcast_s=float(case["broadcast"]),
        group_latency_s=float(case["latency"]),
        queue_delay_s=float(case["queue"]),
        fetch_blocks_generation=fetch_blocks,
    )
    period = float(case["period"])
    predicted = admissible_window_s(inputs, period) / (case["k"] * period)  # share of all start times in a cycle
    assert simulated == pytest.approx(predicted, abs=0.01)


def test_the_never_waiting_condition_is_k_plus_ceil_of_the_lag_window() -> None:
    inputs = CapacityInputs(
        samples_per_step=512, train_s=1.0, staleness_bound=2, broadcast_s=0.3, group_latency_s=0.5, queue_delay_s=0.2
    )
    assert min_feasible_staleness(inputs) == 1 + math.ceil(1.0 / 1.0) == 2  # x / C is exactly 1: no extra step
    assert assess(inputs).staleness_feasible
    slower = CapacityInputs(**{**inputs.__dict__, "group_latency_s": 0.51})
    assert min_feasible_staleness(slower) == 3 and not assess(slower).staleness_feasible
    assert (
        min_feasible_staleness(CapacityInputs(samples_per_step=8, train_s=1.0, staleness_bound=0)) == 1
    )  # S = 0 never holds


def test_throughput_and_overlap_rules() -> None:
    assert required_samples_per_s(512, 2.0) == 256.0
    assert overlap_required_samples_per_s(512, 2.0, 1.0, 1) == 512.0  # T_bcast + R/M <= T: M >= 512 / (2 - 1)
    assert overlap_required_samples_per_s(512, 2.0, 1.0, 2) == pytest.approx(2 * 512 / 3)
    assert overlap_required_samples_per_s(512, 2.0, 2.0, 1) == math.inf  # the broadcast alone fills the window


def test_predicted_period_is_the_smallest_one_whose_admissible_supply_covers_a_step() -> None:
    rng = random.Random(7)
    for _ in range(200):
        inputs = CapacityInputs(
            samples_per_step=rng.choice([64, 512, 4096]),
            train_s=rng.uniform(0.2, 30),
            staleness_bound=rng.randint(0, 6),
            publish_every=rng.choice([1, 2, 4]),
            step_overhead_s=rng.uniform(0, 2),
            broadcast_s=rng.uniform(0, 40),
            group_latency_s=rng.uniform(0, 20),
            queue_delay_s=rng.uniform(0, 5),
            worker_samples_per_s=tuple(rng.uniform(0.5, 50) for _ in range(rng.randint(1, 30))),
            fetch_blocks_generation=rng.random() < 0.5,
        )
        period = predicted_step_s(inputs)
        assert period >= inputs.min_step_s
        assert covers_a_step(inputs, period)
        if period > inputs.min_step_s * (1 + 1e-6):
            assert not covers_a_step(inputs, period * (1 - 1e-6))  # nothing shorter works: the learner must wait
        assert assess(inputs).predicted_utilization == pytest.approx(inputs.train_s / period)


def covers_a_step(inputs: CapacityInputs, period: float) -> bool:
    """Admissible samples per cycle of k steps cover k * R."""
    supply = inputs.total_samples_per_s * admissible_window_s(inputs, period)
    return supply >= inputs.publish_every * inputs.samples_per_step * (1 - 1e-9)


def test_synchronous_baseline_overlaps_nothing() -> None:
    inputs = CapacityInputs(
        samples_per_step=512,
        train_s=2.0,
        staleness_bound=0,
        step_overhead_s=0.5,
        broadcast_s=1.0,
        group_latency_s=0.8,
        queue_delay_s=0.2,
        worker_samples_per_s=(128.0, 128.0),
    )
    assert predicted_step_s(inputs) == pytest.approx(2.5 + 1.0 + 0.8 + 0.2 + 512 / 256)


def test_ample_throughput_and_freshness_keep_the_learner_busy_and_provisioning_is_finite() -> None:
    inputs = CapacityInputs(
        samples_per_step=512,
        train_s=2.0,
        staleness_bound=3,
        broadcast_s=0.5,
        group_latency_s=0.5,
        worker_samples_per_s=(400.0, 400.0),
    )
    result = assess(inputs)
    assert result.predicted_utilization == 1.0 and not result.starved and result.admissible_fraction == 1.0
    # fetching on its own thread: the throughput rule R / C = 256 binds (freshness: k*R / (S*C - x) = 512 / 5)
    assert provisioning_samples_per_s(inputs) == pytest.approx(256.0)
    # fetching between batches: the overlap form k*R / (k*C - T_bcast) = 512 / 1.5 binds
    blocking = CapacityInputs(**{**inputs.__dict__, "fetch_blocks_generation": True})
    assert provisioning_samples_per_s(blocking) == pytest.approx(512 / 1.5)
    hopeless = CapacityInputs(samples_per_step=512, train_s=2.0, staleness_bound=1, broadcast_s=5.0)
    assert math.isfinite(provisioning_samples_per_s(hopeless))  # never infinite: activation needs a target


def test_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="train_s"):
        CapacityInputs(samples_per_step=8, train_s=0.0, staleness_bound=1)
    with pytest.raises(ValueError, match="broadcast_s"):
        CapacityInputs(samples_per_step=8, train_s=1.0, staleness_bound=1, broadcast_s=-1.0)


def test_capped_at_median_bounds_one_liar_and_leaves_honest_values_alone() -> None:
    honest = {"a": 10.0, "b": 14.0, "c": 9.0, "d": 11.0}
    capped = capped_at_median({**honest, "liar": 1e9})
    assert {w: capped[w] for w in honest} == honest
    assert capped["liar"] == MAX_RATIO_TO_MEDIAN * 11.0  # median_low of (9, 10, 11, 14, 1e9)
    # sum(mu_i) moves by at most 4x the largest honest rate, whatever the claim
    assert sum(capped.values()) <= sum(honest.values()) + MAX_RATIO_TO_MEDIAN * max(honest.values())
    # of two workers, the smaller is the median: one liar beside one honest worker is capped too
    assert capped_at_median({"honest": 10.0, "liar": 1e9}) == {"honest": 10.0, "liar": 40.0}
    assert capped_at_median({"alone": 1e9, "idle": 0.0}) == {"alone": 1e9, "idle": 0.0}
