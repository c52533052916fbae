"""simulator/: the discrete-event engine against the capacity model where the model is exact, the
admission rule, failures and activation at scale, and the relay-tree broadcast times."""

from __future__ import annotations

import math

import pytest

from shared.activation import ActivationPolicy
from shared.capacity import CapacityInputs, assess, max_lag_steps
from simulator.cost import Scenario, compare
from simulator.engine import SimConfig, Simulation, simulate
from simulator.fleet import FleetAssumptions, FleetSampler, WorkerSpec
from simulator.relay import RelayNode, broadcast_offsets


def workers(num: int, samples_per_s: float, price: float = 0.0) -> list[WorkerSpec]:
    return [WorkerSpec(f"w{i}", "cpu", price, samples_per_s, 1000.0, 0.0, math.inf) for i in range(num)]


@pytest.mark.parametrize(("num_workers", "staleness_bound"), [(4, 3), (8, 3), (20, 4), (40, 4)])
def test_utilization_matches_the_capacity_model_in_its_fluid_regime(num_workers: int, staleness_bound: int) -> None:
    # many small batches, a deep queue (RunConfig.max_groups_in_flight: B * max(1, S - 1)) and a fixed broadcast:
    # the model's assumptions hold
    config = SimConfig(
        group_size=4,
        groups_per_step=64,
        num_steps=150,
        train_s=1.0,
        step_overhead_s=0.1,
        staleness_bound=staleness_bound,
        max_groups_per_batch=1,
        fixed_broadcast_s=0.3,
        scoring_s=0.0,
    )
    result = simulate(config, workers(num_workers, 8.0))
    predicted = assess(
        CapacityInputs(
            samples_per_step=256,
            train_s=1.0,
            staleness_bound=staleness_bound,
            step_overhead_s=0.1,
            broadcast_s=0.3,
            group_latency_s=0.5,
            worker_samples_per_s=(8.0,) * num_workers,
        )
    )
    assert result.utilization == pytest.approx(predicted.predicted_utilization, rel=0.05)
    assert result.num_dropped_stale == 0


def test_no_group_older_than_the_bound_is_trained_and_lags_stay_within_the_exact_form() -> None:
    config = SimConfig(
        group_size=8,
        groups_per_step=32,
        num_steps=100,
        train_s=0.5,
        staleness_bound=2,
        max_groups_per_batch=8,
        fixed_broadcast_s=0.4,
        scoring_s=0.05,
    )
    result = simulate(config, workers(6, 300.0))
    assert max(result.staleness_histogram) <= 2
    # with this much throughput the learner never waits: P = C = 0.5 and the bound is k - 1 + ceil((C + x) / P)
    assert max(result.staleness_histogram) <= max_lag_steps(0.5, 0.5, 0.4 + 8 * 8 / 300 + 0.05, 1)
    assert result.utilization == pytest.approx(1.0, abs=0.02)


def test_synchronous_s0_matches_the_no_overlap_period() -> None:
    config = SimConfig(
        group_size=4,
        groups_per_step=16,
        num_steps=40,
        train_s=1.0,
        staleness_bound=0,
        max_groups_in_flight=16,
        max_groups_per_batch=1,
        fixed_broadcast_s=0.2,
        scoring_s=0.0,
    )
    result = simulate(config, workers(16, 8.0))  # every worker samples one group of 4 in 0.5 s
    # the learner waits for: the broadcast (0.2) + one round of groups (0.5) after every step (1.0)
    assert result.wall_s / result.num_steps == pytest.approx(1.0 + 0.2 + 0.5, rel=0.02)


def test_failures_lose_no_task_and_activation_keeps_the_cheap_workers_busy_at_scale() -> None:
    sampler = FleetSampler(FleetAssumptions(mean_time_to_failure_s=600.0, mean_rejoin_delay_s=30.0), seed=3)
    fleet = [sampler.draw() for _ in range(400)]
    config = SimConfig(
        group_size=8,
        groups_per_step=800,
        num_steps=15,
        train_s=30.0,
        staleness_bound=4,
        max_groups_per_batch=4,
        payload_bytes=0.3e9,
        claim_idle_s=60,
        lease_s=15,
        activation=ActivationPolicy(min_dwell_s=60.0),
        learner_price_per_hour=20.0,
        seed=3,
    )
    simulation = Simulation(config, fleet, sampler)
    result = simulation.run()
    assert result.num_steps == 15 and result.num_failures > 10
    assert simulation.groups_in_flight() == config.groups_in_flight  # lost batches came back via XAUTOCLAIM
    assert 0 < result.mean_active_workers < 400  # some on standby: not billed
    assert result.workers_usd > 0 and result.runtime_s < 10


def test_the_decentralized_fleet_is_cheaper_per_step_than_h100_rollouts() -> None:
    row = compare(Scenario(num_workers=100, num_steps=12))
    assert row["cost_ratio"] < 1.0
    assert row["decentralized"]["num_steps"] == row["centralized"]["num_steps"] == 12


def test_relay_tree_puts_fast_active_workers_near_the_learner() -> None:
    nodes = [RelayNode(0, 1000.0, 0.01, True), RelayNode(1, 100.0, 0.01, True), RelayNode(2, 1000.0, 0.01, False)]
    offsets = broadcast_offsets(
        nodes, payload_bytes=1e9, chunk_bytes=4e6, learner_uplink_mbps=1000.0, num_seeds=1, fanout=2
    )
    # node 0 is the seed at 1 Gbit/s: ~8 s; node 1 is capped by its own 100 Mbit/s: ~80 s
    assert offsets[0] == pytest.approx(8.0 + 0.032 + 0.01, rel=1e-6)
    assert offsets[1] == pytest.approx(80.0, rel=0.01)
    assert offsets[2] > offsets[0]  # standby after active, even when faster
