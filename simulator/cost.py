"""Cost of this design against a centralized baseline, for one learner workload and fleet size.

Workload (assumptions, see also simulator/fleet.py): GRPO on a 7B model, groups of 8 completions of
~1,000 tokens. The learner trains on H100s at 40% MFU: 8 * 7e9 FLOPs per token (6N forward+backward,
2N recomputing log-probs) = 5.6e13 per sample, i.e. 7.1 samples/s per H100. Its step takes
T_train = 30 s, so R = T_train * required throughput. The workload is sized so that the sampled
decentralized fleet's nominal throughput is 1.5x what the learner consumes: a 10-worker fleet feeds
a 1-GPU learner, a 5,000-worker fleet a ~450-GPU one.

    decentralized   the learner (H100s at $2.49/h) + the WAN fleet; cost-aware activation keeps
                    (1 + margin) x required active, the rest on standby (not billed)
    centralized     the same learner + enough H100s next to it to give (1 + margin) x required
                    throughput (3.0 samples/s each), all active, weights over a 100 Gbit/s fabric

Both run through the same simulator (same learner, staleness bound, batch sizes); cost = learner
for the whole wall time + workers while active. Weights: a LoRA adapter (rank 64, ~0.32 GB) per
version by default; `payload_gb` 15.2 models full bf16 weights.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from shared.activation import ActivationPolicy
from simulator.engine import SimConfig, SimResult, simulate
from simulator.fleet import GPU_TYPES, WAN_MIX, FleetAssumptions, FleetSampler, centralized_fleet

LEARNER_SAMPLES_PER_S_PER_H100 = 989e12 * 0.40 / (8 * 7e9 * 1000)  # 7.06
FLEET_HEADROOM = 1.5  # the fleet's nominal throughput / what the learner consumes


@dataclass(frozen=True)
class Scenario:
    num_workers: int
    num_steps: int = 30
    train_s: float = 30.0
    group_size: int = 8
    staleness_bound: int = 4
    publish_every: int = 1
    payload_gb: float = 0.32
    max_groups_per_batch: int = 4  # 32 concurrent sequences per engine call
    margin: float = 0.2
    learner_uplink_mbps: float = 10_000.0
    seed: int = 0

    def required_samples_per_s(self, assumptions: FleetAssumptions) -> float:
        mix_mu = sum(GPU_TYPES[name].samples_per_s * share for name, share in assumptions.mix)
        mean_mu = mix_mu * math.exp(assumptions.throughput_sigma**2 / 2)  # log-normal jitter's mean
        return self.num_workers * mean_mu / FLEET_HEADROOM

    def groups_per_step(self, assumptions: FleetAssumptions) -> int:
        return max(1, round(self.required_samples_per_s(assumptions) * self.train_s / self.group_size))

    def learner_gpus(self, assumptions: FleetAssumptions) -> int:
        samples_per_s = self.groups_per_step(assumptions) * self.group_size / self.train_s
        return max(1, math.ceil(samples_per_s / LEARNER_SAMPLES_PER_S_PER_H100))


def sim_config(
    scenario: Scenario,
    assumptions: FleetAssumptions,
    *,
    activation: ActivationPolicy | None,
    learner_price: float,
    fabric: bool,
) -> SimConfig:
    return SimConfig(
        group_size=scenario.group_size,
        groups_per_step=scenario.groups_per_step(assumptions),
        num_steps=scenario.num_steps,
        train_s=scenario.train_s,
        train_s_sigma=0.05,
        staleness_bound=scenario.staleness_bound,
        publish_every=scenario.publish_every,
        step_overhead_s=1.0,
        max_groups_per_batch=scenario.max_groups_per_batch,
        call_overhead_s=0.5,
        scoring_s=0.5,
        payload_bytes=scenario.payload_gb * 1e9,
        chunk_bytes=4 << 20,
        learner_uplink_mbps=100_000.0 if fabric else scenario.learner_uplink_mbps,
        relay_num_seeds=4,
        relay_fanout=2,
        claim_idle_s=60.0,
        lease_s=15.0,
        replan_interval_s=10.0,
        activation=activation,
        learner_price_per_hour=learner_price,
        max_sim_s=scenario.num_steps * scenario.train_s * 50,
        seed=scenario.seed,
    )


def compare(scenario: Scenario, assumptions: FleetAssumptions | None = None) -> dict:
    """Simulate both designs for `scenario`; returns a JSON-ready row."""
    assumptions = assumptions or FleetAssumptions()
    learner_gpus = scenario.learner_gpus(assumptions)
    learner_price = learner_gpus * GPU_TYPES["H100"].price_per_hour
    policy = ActivationPolicy(
        margin=scenario.margin,
        hysteresis=0.15,
        min_dwell_s=60.0,
        assumed_samples_per_s=sum(GPU_TYPES[n].samples_per_s * s for n, s in WAN_MIX.items()),
    )
    sampler = FleetSampler(assumptions, seed=scenario.seed)
    fleet = [sampler.draw() for _ in range(scenario.num_workers)]
    decentralized = simulate(
        sim_config(scenario, assumptions, activation=policy, learner_price=learner_price, fabric=False), fleet, sampler
    )
    required = scenario.groups_per_step(assumptions) * scenario.group_size / scenario.train_s
    num_h100 = math.ceil(required * (1 + scenario.margin) / GPU_TYPES["H100"].samples_per_s)
    centralized = simulate(
        sim_config(scenario, assumptions, activation=None, learner_price=learner_price, fabric=True),
        centralized_fleet(num_h100),
    )
    return {
        "num_workers": scenario.num_workers,
        "learner_h100s": learner_gpus,
        "required_samples_per_s": round(required, 2),
        "samples_per_step": scenario.groups_per_step(assumptions) * scenario.group_size,
        "decentralized": summarize(decentralized),
        "centralized": {**summarize(centralized), "rollout_h100s": num_h100},
        "cost_ratio": round(decentralized.usd_per_step / centralized.usd_per_step, 3),
        "rollout_cost_ratio": round(
            (decentralized.workers_usd / max(1, decentralized.num_steps))
            / (centralized.workers_usd / max(1, centralized.num_steps)),
            3,
        ),
        "scenario": asdict(scenario),
    }


def summarize(result: SimResult) -> dict:
    return {
        "num_steps": result.num_steps,
        "wall_s": round(result.wall_s, 1),
        "s_per_step": round(result.wall_s / max(1, result.num_steps), 2),
        "learner_utilization": round(result.utilization, 4),
        "predicted_utilization": round(result.predicted.predicted_utilization, 4) if result.predicted else None,
        "usd_per_step": round(result.usd_per_step, 4),
        "learner_usd_per_step": round(result.learner_usd / max(1, result.num_steps), 4),
        "workers_usd_per_step": round(result.workers_usd / max(1, result.num_steps), 4),
        "mean_active_workers": round(result.mean_active_workers, 1),
        "mean_broadcast_s": round(result.mean_broadcast_s, 2),
        "dropped_stale_groups": result.num_dropped_stale,
        "max_staleness": max(result.staleness_histogram, default=0),
        "failures": result.num_failures,
        "events": result.num_events,
        "sim_runtime_s": round(result.runtime_s, 2),
    }
