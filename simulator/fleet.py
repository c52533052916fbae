"""Who the simulated workers are: GPU types with prices and throughputs, WAN links, failures. Seeded.

Every number here is an ASSUMPTION, written down so the cost comparison can be argued with (it is
also copied into benchmarks/results/cost_comparison.json):

- Workload: GRPO on a 7B model, completions of ~1,000 tokens. One "sample" is one completion.
- Rollout throughput per GPU (samples/s of 1,000-token completions at a large decode batch, vLLM-class
  engine; 7B in bf16, int8/AWQ on 24 GB cards): H100 3.0, A100-80G 2.0, L40S 1.4, RTX A6000 0.8,
  RTX 4090 1.0, RTX 3090 0.6. Each worker's own throughput is the type's value times a log-normal
  factor (sigma 0.2): cards, drivers and hosts differ.
- Prices ($/h, on-demand GPU marketplaces, late 2025): H100 2.49, A100-80G 1.39, L40S 0.89,
  A6000 0.49, RTX 4090 0.35, RTX 3090 0.22; each worker's ask varies uniformly by +-20%.
- Fleet mix of the decentralized pool: 4090 40%, 3090 30%, A6000 15%, L40S 10%, A100-80G 5%.
- WAN: uplink/downlink log-normal, median 300 Mbit/s, sigma 0.8, clipped to [20, 2000]; one-way
  latency to the relay parent uniform 10-75 ms.
- Failures: each worker fails (preempted, host lost) after an exponential time, mean 4 h; a
  replacement of a random type joins after an exponential delay, mean 2 min.
- Centralized baseline: rollouts on H100s in the learner's cluster: 3.0 samples/s each, no failures,
  weights over a 100 Gbit/s fabric.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuType:
    name: str
    samples_per_s: float  # nominal throughput, 1,000-token completions of a 7B model
    price_per_hour: float  # nominal $/h


GPU_TYPES = {
    "H100": GpuType("H100", 3.0, 2.49),
    "A100-80G": GpuType("A100-80G", 2.0, 1.39),
    "L40S": GpuType("L40S", 1.4, 0.89),
    "A6000": GpuType("A6000", 0.8, 0.49),
    "RTX4090": GpuType("RTX4090", 1.0, 0.35),
    "RTX3090": GpuType("RTX3090", 0.6, 0.22),
}
WAN_MIX = {"RTX4090": 0.40, "RTX3090": 0.30, "A6000": 0.15, "L40S": 0.10, "A100-80G": 0.05}


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    gpu_type: str
    price_per_hour: float
    samples_per_s: float  # mu_i while generating
    bandwidth_mbps: float  # its link, both ways
    latency_s: float  # one-way latency to its relay parent
    fails_after_s: float  # seconds after joining; inf: never
    joins_at_s: float = 0.0


@dataclass(frozen=True)
class FleetAssumptions:
    mix: tuple[tuple[str, float], ...] = tuple(WAN_MIX.items())
    throughput_sigma: float = 0.2
    price_spread: float = 0.2
    bandwidth_median_mbps: float = 300.0
    bandwidth_sigma: float = 0.8
    bandwidth_range_mbps: tuple[float, float] = (20.0, 2000.0)
    latency_range_s: tuple[float, float] = (0.010, 0.075)
    mean_time_to_failure_s: float = 4 * 3600.0
    mean_rejoin_delay_s: float = 120.0


class FleetSampler:
    """Draws workers from the assumptions with its own seeded generator."""

    def __init__(self, assumptions: FleetAssumptions, seed: int) -> None:
        self.assumptions = assumptions
        self.rng = random.Random(seed)
        self.num_drawn = 0

    def draw(self, joins_at_s: float = 0.0) -> WorkerSpec:
        a, rng = self.assumptions, self.rng
        names, weights = zip(*a.mix, strict=True)
        gpu = GPU_TYPES[rng.choices(names, weights=weights)[0]]
        low, high = a.bandwidth_range_mbps
        bandwidth = min(high, max(low, a.bandwidth_median_mbps * math.exp(rng.gauss(0.0, a.bandwidth_sigma))))
        fails_after = (
            rng.expovariate(1.0 / a.mean_time_to_failure_s) if math.isfinite(a.mean_time_to_failure_s) else math.inf
        )
        self.num_drawn += 1
        return WorkerSpec(
            worker_id=f"sim-{self.num_drawn:05d}",
            gpu_type=gpu.name,
            price_per_hour=gpu.price_per_hour * rng.uniform(1 - a.price_spread, 1 + a.price_spread),
            samples_per_s=gpu.samples_per_s * math.exp(rng.gauss(0.0, a.throughput_sigma)),
            bandwidth_mbps=bandwidth,
            latency_s=rng.uniform(*a.latency_range_s),
            fails_after_s=fails_after,
            joins_at_s=joins_at_s,
        )

    def rejoin_delay_s(self) -> float:
        return self.rng.expovariate(1.0 / self.assumptions.mean_rejoin_delay_s)


def centralized_fleet(num_workers: int, gpu: str = "H100", bandwidth_mbps: float = 100_000.0) -> list[WorkerSpec]:
    """Identical learner-class GPUs next to the learner: nominal throughput and price, no failures."""
    kind = GPU_TYPES[gpu]
    return [
        WorkerSpec(f"dc-{i:05d}", kind.name, kind.price_per_hour, kind.samples_per_s, bandwidth_mbps, 0.0005, math.inf)
        for i in range(num_workers)
    ]


def straggler_fleet(
    num_workers: int,
    median_samples_per_s: float,
    *,
    slow_fraction: float = 0.1,
    slow_factor: float = 4.0,
    sigma: float = 0.25,
    seed: int = 0,
) -> list[WorkerSpec]:
    """A heterogeneous fleet without failures: the slowest `slow_fraction` of the workers run at the median
    throughput / `slow_factor` (x a 10% log-normal jitter), the others log-normally around the median (sigma),
    never below twice the stragglers' rate. Links are fast: give the run a fixed T_bcast."""
    rng = random.Random(seed)
    num_slow = round(num_workers * slow_fraction)
    floor = 2 * median_samples_per_s / slow_factor
    rates = [median_samples_per_s / slow_factor * math.exp(rng.gauss(0.0, 0.1)) for _ in range(num_slow)]
    rates += [max(floor, median_samples_per_s * math.exp(rng.gauss(0.0, sigma))) for _ in range(num_workers - num_slow)]
    return [WorkerSpec(f"w-{i:05d}", "any", 0.0, rate, 10_000.0, 0.0, math.inf) for i, rate in enumerate(rates)]
