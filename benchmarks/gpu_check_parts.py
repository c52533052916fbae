"""The four measurements of `make gpu-check` (benchmarks/gpu_check.py runs each in a process of its own).

    learner_step  Policy.train_step (services/learner/policy.py: the learner's own step, precision "mixed":
                  fp32 master weights and AdamW state, bf16 autocast compute) at the Qwen3-0.6B shape on
                  sequences of 2k-16k tokens; 16k tokens per micro-batch (rows of one length, 16k / length
                  rows each), 2 micro-batches per step; tokens/s, MFU and peak memory, then 16k again with
                  gradient checkpointing (the layout of the published baseline)
    fsdp          the same Policy sharded with FSDP2 over a world of one rank (NCCL on a GPU, gloo on CPU),
                  initialised in this process: every sharded code path (fully_shard, the registered log-prob
                  forward, the all-gathers and all-reduces of the step, the full-weights gather) on one device
    engine        the torch engine's sampling tokens/s on the device (engines/torch_engine.py), as a worker
                  builds it (engines.select.build_engine) and in the other of float32 / bf16
    cluster       cluster.local.LocalCluster: Redis (the bundled Valkey), coordinator, reward, learner and one
                  torch-engine worker as processes, configs/gpu_check.toml (30 steps on the GPU)

Every size is in `Sizes`: FULL on the GPU, SMOKE (the same code paths, tiny shapes) on CPU.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.devices import synchronize
from services.learner.distributed import RankGroup

if TYPE_CHECKING:
    from services.learner.policy import Policy
    from shared.config import RunConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
# H100 SXM, dense bf16 tensor-core peak (the 1,979 of the datasheet is with 2:4 sparsity)
H100_BF16_DENSE_PEAK_FLOPS = 989e12
# prime-rl's trainer on one H100 (its benchmarks/results/BENCHMARKS.md, 2026-01): Qwen3-0.6B, RL, full weights,
# 16k-token micro-batches, activation recompute, FlashAttention 3. Its MFU counts attention (ours below, too)
BASELINE = {
    "source": "prime-rl benchmarks/results/BENCHMARKS.md: Qwen3-0.6B RL Full, 1xH100 HBM3, recompute, FA3",
    "seq_len": 16384,
    "tokens_per_s": 11_900,
    "peak_memory_gib": 12.5,
    "mfu_with_attention": 0.111,
    "step_s_per_16k_micro_batch": 1.38,
}
GIB = 1 << 30


@dataclass(frozen=True)
class Sizes:
    shape: str  # benchmarks/model_shapes.py
    seq_lens: tuple[int, ...]  # learner_step: tokens per row
    tokens_per_micro_batch: int
    micro_batches_per_step: int
    num_timed_steps: int  # after one warm-up step
    engine_prompts: int
    engine_samples: int  # per prompt
    engine_new_tokens: int
    engine_rounds: int  # after one warm-up round
    cluster_config: str  # under configs/


FULL = Sizes("qwen3-0.6b", (2048, 4096, 8192, 16384), 16384, 2, 2, 16, 8, 128, 2, "gpu_check.toml")
SMOKE = Sizes("qwen3-tiny", (64, 128), 256, 2, 1, 4, 4, 16, 1, "gpu_check_smoke.toml")


# learner_step
def learner_step_part(model_dir: Path, sizes: Sizes) -> dict[str, Any]:
    """Tokens/s, MFU and peak memory of the learner's step at each sequence length, then at the longest
    with gradient checkpointing."""
    from benchmarks.model_shapes import parameter_count
    from services.learner.policy import Policy

    num_parameters = parameter_count(sizes.shape)
    policy = Policy(model_dir, learner_run(sizes, sizes.seq_lens[0], gradient_checkpointing=False))
    rows = [measure_steps(policy, sizes, seq_len, num_parameters) for seq_len in sizes.seq_lens]
    del policy
    free_device_memory()
    longest = sizes.seq_lens[-1]
    policy = Policy(model_dir, learner_run(sizes, longest, gradient_checkpointing=True))
    rows.append(measure_steps(policy, sizes, longest, num_parameters))
    at_baseline = [r for r in rows if r["seq_len"] == BASELINE["seq_len"] and "tokens_per_s" in r]
    return {
        "shape": sizes.shape,
        "num_parameters": num_parameters,
        "precision": policy.precision.mode,
        "param_dtype": str(policy.precision.param_dtype),
        "compute_dtype": str(policy.precision.compute_dtype),
        "mfu_formula": "6 * num_parameters * tokens / step_s / peak_flops (attention FLOPs not counted); "
        "mfu_with_attention adds 6 * layers * seq_len * heads * head_dim per token (prime-rl's, causal)",
        "peak_flops": H100_BF16_DENSE_PEAK_FLOPS,
        "peak_flops_source": "H100 SXM dense bf16",
        "layout": f"{sizes.tokens_per_micro_batch} tokens per micro-batch, {sizes.micro_batches_per_step} per step",
        "steps": rows,
        "baseline": BASELINE,
        "vs_baseline": [
            {
                "gradient_checkpointing": r["gradient_checkpointing"],
                "tokens_per_s_ratio": round(r["tokens_per_s"] / BASELINE["tokens_per_s"], 3),
                "mfu_with_attention_ratio": round(r["mfu_with_attention"] / BASELINE["mfu_with_attention"], 3),
                "peak_memory_ratio": round(r["peak_memory_gib"] / BASELINE["peak_memory_gib"], 3),
            }
            for r in at_baseline
        ],
    }


def learner_run(sizes: Sizes, seq_len: int, *, gradient_checkpointing: bool) -> RunConfig:
    """The run file of one layout: rows of `seq_len` tokens, tokens_per_micro_batch per micro-batch, one
    group of all the step's rows (its size does not change the cost)."""
    from shared.config import GRPOConfig, LearnerConfig, RunConfig

    rows_per_micro_batch = max(1, sizes.tokens_per_micro_batch // seq_len)
    num_rows = rows_per_micro_batch * sizes.micro_batches_per_step
    return RunConfig(
        run_id="gpu-check",
        grpo=GRPOConfig(group_size=max(2, num_rows), groups_per_step=1, learning_rate=1e-6),
        learner=LearnerConfig(
            device="cuda" if cuda_available() else "cpu",
            precision="mixed",
            micro_batch_size=rows_per_micro_batch,
            gradient_checkpointing=gradient_checkpointing,
        ),
    )


def measure_steps(policy: Policy, sizes: Sizes, seq_len: int, num_parameters: int) -> dict[str, Any]:
    """One warm-up step and num_timed_steps timed ones of `policy` on rows of `seq_len` random tokens."""
    import torch

    from benchmarks.learner_memory import synthetic_batch

    checkpointing = policy.run.learner.gradient_checkpointing
    # The layout (rows per micro-batch) is the run file's: each length gets its own, on the same weights.
    policy.run = learner_run(sizes, seq_len, gradient_checkpointing=checkpointing)
    num_rows = policy.run.learner.micro_batch_size * sizes.micro_batches_per_step
    row: dict[str, Any] = {"seq_len": seq_len, "num_rows": num_rows, "gradient_checkpointing": checkpointing}
    batch = synthetic_batch(num_rows, seq_len, min(64, seq_len // 4), policy.config.vocab_size)
    reset_peak_memory()
    try:
        step_s = timed_steps(policy, batch, sizes.num_timed_steps)
    except torch.OutOfMemoryError as exc:  # a length that does not fit is a result, not a failed check
        free_device_memory()
        return row | {"error": f"out of memory: {str(exc)[:200]}"}
    tokens_per_s = num_rows * seq_len / statistics.median(step_s)
    return row | {
        "step_s": [round(s, 3) for s in step_s],
        "tokens_per_s": round(tokens_per_s),
        "mfu": significant(6 * num_parameters * tokens_per_s / H100_BF16_DENSE_PEAK_FLOPS),
        "mfu_with_attention": significant(
            (6 * num_parameters + attention_flops_per_token(sizes.shape, seq_len))
            * tokens_per_s
            / H100_BF16_DENSE_PEAK_FLOPS
        ),
        **peak_memory(),
    }


def attention_flops_per_token(shape: str, seq_len: int) -> int:
    """Forward + backward of the attention matmuls (QK^T and AV, 2 x 2 x seq_len x heads x head_dim each
    forward, halved by the causal mask, x3 with the backward) per token, summed over the layers: the term
    prime-rl's MFU adds to 6 x parameters."""
    from benchmarks.model_shapes import SHAPES

    s = SHAPES[shape]
    return 6 * s["num_hidden_layers"] * seq_len * s["num_attention_heads"] * s["head_dim"]


def significant(value: float) -> float:
    return float(f"{value:.3g}")


def timed_steps(policy: Policy, batch: Any, num_timed_steps: int) -> list[float]:
    """Seconds of each learner step after the first (allocator and kernel warm-up), device work included."""
    step_s = []
    for step in range(num_timed_steps + 1):
        synchronize()
        started_s = time.perf_counter()
        result = policy.train_step(batch, [batch.num_samples], shuffle_seed=step)
        synchronize()
        step_s.append(time.perf_counter() - started_s)
        diagnostics = result.diagnostics
        if not (math.isfinite(diagnostics.loss) and math.isfinite(diagnostics.grad_norm)):
            raise RuntimeError(f"step {step}: loss {diagnostics.loss}, grad norm {diagnostics.grad_norm}")
    return step_s[1:]


# fsdp
@dataclass(frozen=True)
class OneRankShards(RankGroup):
    """A world of one rank that still takes the sharded path: FSDP2 over a mesh of one device. With
    world_size 1 a RankGroup is a plain single process (no sharding), so the sharded code could not run
    on a one-GPU machine otherwise."""

    @property
    def is_sharded(self) -> bool:
        return True


def fsdp_part(model_dir: Path, sizes: Sizes) -> dict[str, Any]:
    """The first step's loss of the plain policy, then the same step sharded over one rank: its time,
    loss and the full-weights gather (what rank 0 publishes)."""
    from benchmarks.learner_memory import synthetic_batch
    from services.learner.policy import Policy

    seq_len = sizes.seq_lens[0]
    run = learner_run(sizes, seq_len, gradient_checkpointing=False)
    num_rows = run.learner.micro_batch_size * sizes.micro_batches_per_step
    plain = Policy(model_dir, run)
    batch = synthetic_batch(num_rows, seq_len, min(64, seq_len // 4), plain.config.vocab_size)
    plain_loss = plain.train_step(batch, [num_rows], shuffle_seed=0).diagnostics.loss
    del plain
    free_device_memory()

    ranks = init_one_rank()
    try:
        policy = Policy(model_dir, run, ranks)
        first_loss = policy.train_step(batch, [num_rows], shuffle_seed=0).diagnostics.loss
        reset_peak_memory()
        step_s = timed_steps(policy, batch, sizes.num_timed_steps)
        synchronize()
        started_s = time.perf_counter()
        weights = policy.weights()  # the full weights, gathered into rank 0's CPU replica
        gather_s = time.perf_counter() - started_s
        finite = all(bool(parameter.isfinite().all()) for parameter in weights.parameters())
        policy.close()
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {
        "backend": "nccl" if cuda_available() else "gloo",
        "world_size": 1,
        "seq_len": seq_len,
        "num_rows": num_rows,
        "first_step_loss": first_loss,
        "plain_first_step_loss": plain_loss,
        "step_s": [round(s, 3) for s in step_s],
        "tokens_per_s": round(num_rows * seq_len / statistics.median(step_s)),
        "gather_full_weights_s": round(gather_s, 3),
        "gathered_weights_finite": finite,
        **peak_memory(),
    }


def init_one_rank() -> OneRankShards:
    """A process group of one (this process) and its 1-D device mesh, as distributed.init_ranks makes for G."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from cluster.ports import free_port

    init_method = f"tcp://127.0.0.1:{free_port()}"
    timeout = datetime.timedelta(seconds=120)
    if cuda_available():
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", init_method=init_method, rank=0, world_size=1, device_id=device, timeout=timeout
        )
    else:
        dist.init_process_group("gloo", init_method=init_method, rank=0, world_size=1, timeout=timeout)
    mesh = init_device_mesh("cuda" if cuda_available() else "cpu", (1,))
    return OneRankShards(rank=0, world_size=1, local_rank=0, mesh=mesh)


# engine
def engine_part(model_dir: Path, sizes: Sizes) -> dict[str, Any]:
    """Sampling tokens/s of the torch engine as a worker builds it (engines.select: the dtype of `[rollout]
    dtype`, by default the folder's: bf16 here), then in the other of float32 / bfloat16."""
    import torch

    from engines.select import build_engine
    from engines.torch_engine import TorchEngine
    from shared.config import RolloutConfig
    from shared.tasks import make_task

    task = make_task("arithmetic_mod10", num_eval_prompts=1, seed=0)
    prompts = [task.sample_prompt().prompt for _ in range(sizes.engine_prompts)]
    result: dict[str, Any] = {
        "workload": f"{sizes.engine_prompts} prompts x {sizes.engine_samples} samples x <= {sizes.engine_new_tokens} "
        "new tokens in one generate call, temperature 1.0",
    }
    worker_engine = build_engine("torch", model_dir, RolloutConfig(engine="torch"), num_threads=os.cpu_count() or 1)
    result["worker"] = sampling_rate(worker_engine, prompts, sizes)
    other_dtype = torch.float32 if worker_engine.dtype == torch.bfloat16 else torch.bfloat16
    del worker_engine
    free_device_memory()
    device = "cuda" if cuda_available() else "cpu"
    result["other_dtype"] = sampling_rate(TorchEngine(model_dir, device=device, dtype=other_dtype), prompts, sizes)
    return result


def sampling_rate(engine: Any, prompts: list[str], sizes: Sizes) -> dict[str, Any]:
    from engines.interface import Sampling

    rates, lengths = [], []
    for round_index in range(sizes.engine_rounds + 1):  # round 0 warms up
        synchronize()
        started_s = time.perf_counter()
        groups = engine.generate(prompts, Sampling(sizes.engine_samples, sizes.engine_new_tokens, 1.0))
        synchronize()
        num_tokens = sum(sample.num_tokens for group in groups for sample in group)
        if round_index:
            rates.append(num_tokens / (time.perf_counter() - started_s))
            lengths.append(num_tokens / (len(prompts) * sizes.engine_samples))
    return {
        "device": str(engine.device),
        "dtype": str(engine.dtype),
        "tokens_per_s": [round(rate) for rate in rates],
        "mean_completion_tokens": round(statistics.fmean(lengths), 1),
    }


# cluster
def cluster_part(sizes: Sizes, runs_dir: Path, run_id: str) -> dict[str, Any]:
    """A whole local cluster run (one torch-engine worker) to the end of its steps; its summary."""
    from cluster.local import ClusterOptions, LocalCluster
    from cluster.report import build_report
    from shared.run_records import LearnerSummary, read_metrics

    config_path = REPO_ROOT / "configs" / sizes.cluster_config
    cluster = LocalCluster(ClusterOptions(config_path, num_workers=1, runs_dir=runs_dir, run_id=run_id))
    started_s = time.monotonic()
    try:
        cluster.start()
        status = cluster.wait_until_done()
    finally:
        cluster.stop()
    wall_s = time.monotonic() - started_s
    steps, evals = read_metrics(cluster.run_dir / "metrics.jsonl")
    report = build_report(cluster.run_dir, cluster.run, status, wall_s, steps, evals)  # no plots: no matplotlib
    summary = LearnerSummary.model_validate_json((cluster.run_dir / "learner_summary.json").read_text())
    return {
        "config": f"configs/{sizes.cluster_config}",
        "num_steps_target": cluster.run.schedule.num_steps,
        "finished": summary.finished,
        "learner_device": cluster.run.learner.device,
        "learner_precision": cluster.run.learner.precision,
        "engine": cluster.run.rollout.engine,
        "num_steps": report.num_steps,
        "wall_s": report.wall_s,
        "learner_busy_fraction": report.learner_busy_fraction,
        "reward_mean_first10": report.reward_mean_first10,
        "reward_mean_last10": report.reward_mean_last10,
        "eval_accuracy_before": report.eval_accuracy_before,
        "eval_accuracy_after": report.eval_accuracy_after,
        "max_trained_staleness": report.max_trained_staleness,
        "num_dead_letters": report.num_dead_letters,
    }


# device helpers
def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def reset_peak_memory() -> None:
    import torch

    if cuda_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict[str, Any]:
    """Peak memory since the last reset: torch.cuda.max_memory_allocated on a GPU; on CPU the process's
    peak RSS (ru_maxrss, never reset: an upper bound)."""
    import torch

    if cuda_available():
        return {"peak_memory_gib": round(torch.cuda.max_memory_allocated() / GIB, 2), "peak_memory_kind": "cuda"}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_memory_gib": round(peak_kib * 1024 / GIB, 2), "peak_memory_kind": "cpu peak RSS"}


def free_device_memory() -> None:
    import torch

    gc.collect()
    if cuda_available():
        torch.cuda.empty_cache()
