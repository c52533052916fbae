"""Batch-at-a-time vs continuous batching with in-flight weight updates, per engine, on a long-tailed workload.

    python -m benchmarks.continuous_engines --vllm-python .venv-vllm-cpu/bin/python   # or: make bench-continuous-engines

The engine alone, the way a worker drives it (docs/continuous_batching.md), without a cluster around it:

- workload: NUM_TASKS tasks x NUM_SAMPLES samples of the demo's prompts, up to MAX_NEW_TOKENS new tokens at
  temperature 1 with keyed seeds, on the demo's model shape with 2 heads of 32 (vLLM's CPU kernels) and a
  longer context. A random policy on the 16-character vocabulary samples EOS about once in 15 tokens, so
  lengths are geometric: most samples end within a few tokens, a few run past 60 (the distribution is
  written into the result);
- batch: WORKER_BATCH_TASKS tasks per `generate` call (the worker's default worker_max_groups_per_batch),
  one call after another; a new version is loaded at the first batch boundary after it is published;
- continuous: every sample a row of one continuous batch of MAX_ROWS rows (the same rows as one batch call);
  a new version is loaded between the two decoding steps after it is published, rows in flight;
- versions: a new one is "published" every PUBLISH_EVERY_S seconds of the run (a perturbed copy of the
  weights, as the learner sends it), in both modes.

torch also runs continuous mode keeping the old weights' KV cache after a load (kv_after_update="keep"), to
measure what recomputing buys: for tokens sampled after a mid-sample update, the deviation of their
behaviour log-probs from the log-probs their version gives the whole context (what a spot audit compares).

Windows. tokens/s: from a mode's start to its last sample finished, every load and recompute inside. The pause
per load: the engine's `load_weights` plus, in continuous mode, the recompute of the rows in flight (vLLM: the
whole first step after the load). Publish to in use: from the moment a version is due (the blob already in
the worker's memory) to the engine sampling with it, the recompute included. Outside every window: the
learner's step and the weights' transfer and verification (benchmarks/broadcast/, docs/weight_path.md time
those), and the reward and learner services: this is the engine alone.

Also measured: occupancy (tokens decoded / rows x steps the engine ran: batch mode pays for finished rows
riding along) and, in continuous mode, the fraction of samples that saw a version land mid-sample.

Each engine runs in its own subprocess under the interpreter that has it (vLLM: .venv-vllm-cpu). The modes
run in the same subprocess on the same engine, alternating, NUM_REPEATS times; each mode reports its run of
median tokens/s (and every run's tokens/s): lengths are random, and one long sample in a batch costs batch
mode the most. Writes benchmarks/results/continuous_engines.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.engine_child import run_engine_child
from benchmarks.result_file import write_result

RESULTS = Path("benchmarks/results/continuous_engines.json")
NUM_TASKS = 256
NUM_SAMPLES = 8
MAX_NEW_TOKENS = 192
WORKER_BATCH_TASKS = 16
MAX_ROWS = WORKER_BATCH_TASKS * NUM_SAMPLES
PUBLISH_EVERY_S = 0.5
NUM_REPEATS = 3
MAX_POSITIONS = 256


def build_model(out_dir: Path) -> Path:
    from services.learner.model_init import build_initial_policy
    from shared.config import load_run_config
    from shared.tasks import TASKS

    demo = load_run_config(Path("configs/demo.toml"))
    config = demo.model.model_copy(
        update={"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": MAX_POSITIONS}
    )
    return build_initial_policy(config, TASKS[demo.task.name].alphabet, out_dir / "model")


class Publisher:
    """A new version every PUBLISH_EVERY_S seconds from the start of a mode: what is due, and when it was."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs
        self.started_s = time.perf_counter()
        self.loaded = 0  # versions loaded so far (version 0 is loaded before the start)

    def due(self) -> tuple[int, float] | None:
        """The newest version published and not loaded yet, and when it was published; None: nothing new."""
        newest = min(int((time.perf_counter() - self.started_s) / PUBLISH_EVERY_S), len(self.blobs) - 1)
        if newest <= self.loaded:
            return None
        return newest, self.started_s + newest * PUBLISH_EVERY_S


def measure(kind: str, model_dir: Path) -> dict[str, Any]:
    """Both modes on one engine, in this process (a subprocess of main)."""
    import torch
    from safetensors.torch import load_file
    from safetensors.torch import save as safetensors_save

    from engines.interface import Sampling
    from engines.select import build_engine
    from shared.config import RolloutConfig

    engine = build_engine(kind, model_dir, RolloutConfig(engine=kind), num_threads=1, device="cpu")
    state = load_file(str(model_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    blobs = [
        safetensors_save(
            {k: (v + 0.01 * torch.randn(v.shape, generator=generator)).contiguous() for k, v in state.items()}
        )
        for _ in range(256)
    ]
    prompts = [f"{i % 10}+{(i * 7) % 10}{i // 10}=" for i in range(NUM_TASKS)]
    seeds = [1000 + 100 * i for i in range(NUM_TASKS)]
    engine.load_weights(blobs[0], policy_version=0)
    engine.generate(prompts[:2], Sampling(2, 4, 1.0))  # warm-up
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(NUM_REPEATS):  # the modes alternate, so a busy moment of the machine hits each alike
        engine.load_weights(blobs[0], policy_version=0)
        runs.setdefault("batch", []).append(run_batch_mode(engine, blobs, prompts, seeds))
        engine.load_weights(blobs[0], policy_version=0)
        measured, finished = run_continuous_mode(engine, blobs, prompts, seeds)
        runs.setdefault("continuous", []).append(measured)
        if kind == "torch":  # what recomputing buys: the same run keeping the old weights' KV cache
            measured["deviation_nats"] = version_deviation(model_dir, blobs, finished)
            engine.load_weights(blobs[0], policy_version=0)
            kept, finished = run_continuous_mode(engine, blobs, prompts, seeds, "keep")
            kept["deviation_nats"] = version_deviation(model_dir, blobs, finished)
            runs.setdefault("continuous_keep_kv", []).append(kept)
    results = {}
    for mode, mode_runs in runs.items():  # the run of median tokens/s, and every run's
        ordered = sorted(mode_runs, key=lambda run: run["tokens_per_s"])
        results[mode] = {**ordered[len(ordered) // 2], "tokens_per_s_runs": [run["tokens_per_s"] for run in mode_runs]}
    results["continuous_vs_batch_tokens_per_s"] = round(
        results["continuous"]["tokens_per_s"] / results["batch"]["tokens_per_s"], 2
    )
    return results


def load(engine: Any, publisher: Publisher, pauses: list[float], latencies: list[float]) -> None:
    due = publisher.due()
    if due is None:
        return
    version, published_at_s = due
    started_s = time.perf_counter()
    engine.load_weights(publisher.blobs[version], policy_version=version)
    pauses.append(time.perf_counter() - started_s)
    latencies.append(time.perf_counter() - published_at_s)
    publisher.loaded = version


def run_batch_mode(engine: Any, blobs: list[bytes], prompts: list[str], seeds: list[int]) -> dict[str, Any]:
    from engines.interface import Sampling

    publisher = Publisher(blobs)
    pauses: list[float] = []
    latencies: list[float] = []
    lengths: list[int] = []
    rows_x_steps = 0
    for first in range(0, len(prompts), WORKER_BATCH_TASKS):
        load(engine, publisher, pauses, latencies)  # a batch boundary
        groups = engine.generate(
            prompts[first : first + WORKER_BATCH_TASKS],
            Sampling(NUM_SAMPLES, MAX_NEW_TOKENS, 1.0),
            sampling_seeds=seeds[first : first + WORKER_BATCH_TASKS],
        )
        batch_lengths = [sample.num_tokens for group in groups for sample in group]
        lengths.extend(batch_lengths)
        rows_x_steps += len(batch_lengths) * max(batch_lengths)  # every row rides along to the longest
    wall_s = time.perf_counter() - publisher.started_s
    return summary(wall_s, lengths, sum(lengths) / rows_x_steps, pauses, latencies, 0.0)


def run_continuous_mode(
    engine: Any, blobs: list[bytes], prompts: list[str], seeds: list[int], kv_after_update: str = "recompute"
) -> tuple[dict[str, Any], list[Any]]:
    from engines.continuous import SampleRequest
    from engines.interface import Sampling
    from engines.torch_continuous import TorchContinuousBatch

    prompt_ids = engine.encode_prompts(prompts, MAX_NEW_TOKENS)
    if kv_after_update == "recompute":
        batch = engine.continuous_batch(MAX_ROWS)
    else:
        batch = TorchContinuousBatch(engine, MAX_ROWS, kv_after_update="keep")
    batch.add(
        [
            SampleRequest(i * NUM_SAMPLES + j, tuple(ids), Sampling(1, MAX_NEW_TOKENS, 1.0), seeds[i] + j)
            for i, ids in enumerate(prompt_ids)
            for j in range(NUM_SAMPLES)
        ]
    )
    publisher = Publisher(blobs)
    pauses: list[float] = []
    latencies: list[float] = []
    finished = []
    rows_per_step = []
    while batch.num_running or batch.num_waiting:
        loaded_before = len(pauses)
        load(engine, publisher, pauses, latencies)  # between two decoding steps
        finished.extend(batch.step())
        stats = batch.last_step
        rows_per_step.append(stats.num_rows)
        if len(pauses) > loaded_before:
            # the rows in flight are recomputed with the new weights before it samples: part of the pause, and
            # of the wait until the version is in use
            pauses[-1] += stats.recompute_s
            latencies[-1] += stats.recompute_s
    wall_s = time.perf_counter() - publisher.started_s
    lengths = [done.sample.num_tokens for done in finished]
    mixed = sum(1 for done in finished if len(done.versions) > 1) / len(finished)
    occupancy = sum(lengths) / (MAX_ROWS * len(rows_per_step))
    return summary(wall_s, lengths, occupancy, pauses, latencies, mixed), finished


def version_deviation(
    model_dir: Path, blobs: list[bytes], finished: list[Any], num_samples: int = 64
) -> dict[str, Any]:
    """|behaviour log-prob - the log-prob its version gives the whole context| over the tokens sampled after a
    mid-sample update, for up to `num_samples` such samples: what a spot audit compares (0 up to float error
    when the cache is recomputed)."""
    import torch
    from safetensors.torch import load as safetensors_load
    from transformers import AutoModelForCausalLM

    mixed = [done for done in finished if len(done.versions) > 1][:num_samples]
    if not mixed:
        return {"num_samples": 0}
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    deviations: list[float] = []
    for done in sorted(mixed, key=lambda d: d.versions[1].policy_version):
        sample, change = done.sample, done.versions[1]
        reference.load_state_dict(safetensors_load(blobs[change.policy_version]), strict=False)
        ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
        with torch.no_grad():
            logits = reference(input_ids=ids).logits[0, len(sample.prompt_token_ids) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)
        end = done.versions[2].token_index if len(done.versions) > 2 else len(sample.token_ids)
        after = torch.tensor(sample.logprobs[change.token_index : end]) - logprobs[change.token_index : end]
        deviations.extend(after.abs().tolist())
    return {
        "num_samples": len(mixed),
        "num_tokens": len(deviations),
        "mean": round(statistics.fmean(deviations), 6) if deviations else None,
        "max": round(max(deviations), 6) if deviations else None,
    }


def summary(
    wall_s: float,
    lengths: list[int],
    occupancy: float,
    pauses: list[float],
    latencies: list[float],
    mixed_fraction: float,
) -> dict[str, Any]:
    ordered = sorted(lengths)
    return {
        "wall_s": round(wall_s, 2),
        "num_tokens": sum(lengths),
        "tokens_per_s": round(sum(lengths) / wall_s, 1),
        "occupancy": round(occupancy, 3),
        "num_loads": len(pauses),
        "load_pause_ms_mean": round(1000 * statistics.fmean(pauses), 2) if pauses else None,
        "load_pause_ms_max": round(1000 * max(pauses), 2) if pauses else None,
        "publish_to_use_ms_mean": round(1000 * statistics.fmean(latencies), 1) if latencies else None,
        "publish_to_use_ms_max": round(1000 * max(latencies), 1) if latencies else None,
        "samples_with_mid_sample_update": round(mixed_fraction, 3),
        "completion_tokens": {
            "median": ordered[len(ordered) // 2],
            "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "max": ordered[-1],
            "mean": round(statistics.fmean(lengths), 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vllm-python", default=".venv-vllm-cpu/bin/python", help="interpreter of the vLLM environment"
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="limit for one engine")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], Path(args.child[1]))), flush=True)
        return
    results: dict[str, Any] = {
        "command": "make bench-continuous-engines",
        "host": {"machine": platform.machine(), "num_cpus": os.cpu_count(), "python": platform.python_version()},
        "workload": {
            "num_tasks": NUM_TASKS,
            "num_samples": NUM_SAMPLES,
            "max_new_tokens": MAX_NEW_TOKENS,
            "temperature": 1.0,
            "worker_batch_tasks": WORKER_BATCH_TASKS,
            "continuous_max_rows": MAX_ROWS,
            "publish_every_s": PUBLISH_EVERY_S,
            "repeats": NUM_REPEATS,
        },
        "engines": {},
    }
    with tempfile.TemporaryDirectory(prefix="continuous-bench-") as tmp:
        model_dir = build_model(Path(tmp))
        for kind, python in (("torch", sys.executable), ("vllm", args.vllm_python)):
            load_before = os.getloadavg()[0]
            measured = run_engine_child(python, "benchmarks.continuous_engines", [kind, str(model_dir)], args.timeout_s)
            results["engines"][kind] = {**measured, "load_avg_1min_before": round(load_before, 2)}
            print(kind, json.dumps(results["engines"][kind]), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS, results)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
