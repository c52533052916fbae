"""The GPU numbers of issue 9, in one command, on a machine with one CUDA GPU:

    make setup-vllm && make bench-gpu          # or: python -m benchmarks.gpu
    python -m benchmarks.gpu --smoke           # the same phases at tiny sizes on CPU (checks the script)

Phases, each in its own process (vLLM never shares a process with the learner):
- generation: the rollout worker's engine (engines/vllm_engine.py `generate`, called as the worker calls
  it: 16 tasks x G=8 samples per call, behaviour log-probs on) against bare `vllm.LLM.generate` on the
  same LLM object, same token-id prompts, same sampling parameters (no log-probs: what a bare user
  asks for), alternating, 3 rounds each. Window: the generate call alone (prompts already encoded for
  the bare path, encoded inside the engine's call: that is part of what the worker pays). Target: the
  engine >= 90% of bare tokens/s.
- swap: `load_weights` of a full new version (a perturbed copy of the weights, as a safetensors blob in
  memory, the form the worker holds after verification): validation, the local file, vLLM's layerwise
  reload, the tied-embedding fix, the prefix-cache reset; then one greedy generate to prove it served.
- learner_step: one GRPO step (forward, backward, AdamW) of the learner (Policy.train_step) at the Qwen3-0.6B
  shape in mixed precision on the GPU, at the demo batch (64 groups x 8 = 512 rows) and 300 tokens per row;
  micro-batches of --micro-batch-size rows. Reports seconds per step and peak GPU memory.
- cluster: the whole local cluster (configs/gpu_smoke.toml: arithmetic, vLLM worker, mixed-precision learner) on
  the 0.6B-shaped folder for a few steps; reports the run's summary.

The model is random-init at Qwen3-0.6B's shape (benchmarks/model_shapes.py; no hub), in bf16.
`--vllm-python` is the interpreter of the vLLM environment (default .venv-vllm, else .venv-vllm-cpu).
Writes benchmarks/results/gpu.json (--smoke: benchmarks/results/gpu_smoke.json) with device and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.devices import device_name

REPO_ROOT = Path(__file__).resolve().parent.parent
PHASES = ("generation", "swap", "learner_step", "cluster")
TASKS_PER_CALL = 16  # services/rollout/settings.py worker_max_groups_per_batch default
GROUP_SIZE = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {PHASES}")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks the script, not a result")
    parser.add_argument("--vllm-python", type=Path, default=None, help="python of the vLLM environment")
    parser.add_argument("--model-dir", type=Path, default=None, help="reuse this folder (default: build one)")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts per generation round")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=64, help="learner rows per forward/backward")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="limit per phase")
    parser.add_argument("--child", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.num_prompts, args.max_new_tokens, args.rounds = min(args.num_prompts, 16), min(args.max_new_tokens, 32), 2
    if args.child:
        result = CHILDREN[args.child](args)
        args.child_out.write_text(json.dumps(result))
        return
    run_all(args)


def run_all(args: argparse.Namespace) -> None:
    shape, dtype = ("qwen3-25m", "float32") if args.smoke else ("qwen3-0.6b", "bfloat16")
    work_dir = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    try:
        run_phases(args, work_dir, shape, dtype)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)  # the built folder (1.2 GB at 0.6B) and phase records


def run_phases(args: argparse.Namespace, work_dir: Path, shape: str, dtype: str) -> None:
    if args.model_dir is None:
        from benchmarks.model_shapes import build_qwen3_folder

        print(f"building a random {shape} folder ({dtype}) in {work_dir / shape} ...", flush=True)
        args.model_dir = build_qwen3_folder(shape, work_dir / shape, dtype=dtype)
    vllm_python = args.vllm_python or next(
        (p for p in (REPO_ROOT / ".venv-vllm/bin/python", REPO_ROOT / ".venv-vllm-cpu/bin/python") if p.exists()),
        None,
    )
    results: dict[str, object] = {
        "command": "python -m benchmarks.gpu" + (" --smoke" if args.smoke else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device_name(),
        "host": platform.node(),
        "model_shape": shape,
        "model_dtype": dtype,
        "vllm_python": str(vllm_python),
    }
    for phase in args.phases.split(","):
        needs_vllm = phase in ("generation", "swap", "cluster")
        if needs_vllm and vllm_python is None:
            results[phase] = {"error": "no vLLM environment: run `make setup-vllm` (GPU) or `make setup-vllm-cpu`"}
            continue
        python = vllm_python if needs_vllm else Path(sys.executable)
        print(f"phase {phase} ({python}) ...", flush=True)
        results[phase] = run_child(python, phase, args, work_dir)
        print(f"  {json.dumps(results[phase])[:400]}", flush=True)
    out = REPO_ROOT / "benchmarks/results" / ("gpu_smoke.json" if args.smoke else "gpu.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


def run_child(python: Path, phase: str, args: argparse.Namespace, work_dir: Path) -> dict:
    """One phase in a fresh process of `python`; a failure comes back as a record, not an exception."""
    child_out = work_dir / f"{phase}.json"
    command = [str(python), "-m", "benchmarks.gpu", "--child", phase, "--child-out", str(child_out)]
    command += ["--model-dir", str(args.model_dir), "--num-prompts", str(args.num_prompts)]
    command += ["--max-new-tokens", str(args.max_new_tokens), "--rounds", str(args.rounds)]
    command += ["--micro-batch-size", str(args.micro_batch_size)] + (["--smoke"] if args.smoke else [])
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"over {args.timeout_s} s"}
    if done.returncode != 0 or not child_out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)[-600:]}
    return json.loads(child_out.read_text())


# phases (run in the child process)
def generation_phase(args: argparse.Namespace) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from engines.interface import Sampling

    engine, prompts = vllm_engine_and_prompts(args)
    token_prompts = [TokensPrompt(prompt_token_ids=ids) for ids in engine.encode_prompts(prompts)]
    eos_ids = sorted(engine.eos_token_ids)
    bare_params = SamplingParams(n=GROUP_SIZE, temperature=1.0, max_tokens=args.max_new_tokens, stop_token_ids=eos_ids)

    def engine_round() -> int:
        num_tokens = 0
        for start in range(0, len(prompts), TASKS_PER_CALL):
            groups = engine.generate(
                prompts[start : start + TASKS_PER_CALL], Sampling(GROUP_SIZE, args.max_new_tokens, 1.0)
            )
            num_tokens += sum(sample.num_tokens for group in groups for sample in group)
        return num_tokens

    def bare_round() -> int:
        num_tokens = 0
        for start in range(0, len(token_prompts), TASKS_PER_CALL):
            outputs = engine.call_on_engine_thread(  # the thread the engine's own calls run on
                engine.llm.generate, token_prompts[start : start + TASKS_PER_CALL], bare_params, use_tqdm=False
            )
            num_tokens += sum(len(c.token_ids) for output in outputs for c in output.outputs)
        return num_tokens

    engine_round(), bare_round()  # warm-up: CUDA graphs, allocator
    rates: dict[str, list[float]] = {"engine": [], "bare": []}
    for _ in range(args.rounds):
        for name, round_fn in (("engine", engine_round), ("bare", bare_round)):
            started_s = time.perf_counter()
            num_tokens = round_fn()
            rates[name].append(num_tokens / (time.perf_counter() - started_s))
    engine_rate, bare_rate = statistics.median(rates["engine"]), statistics.median(rates["bare"])
    return {
        "workload": f"{len(prompts)} prompts x {GROUP_SIZE} samples x <= {args.max_new_tokens} tokens, "
        f"{TASKS_PER_CALL} prompts per call, temperature 1.0",
        "engine_tokens_per_s": [round(r) for r in rates["engine"]],
        "bare_vllm_tokens_per_s": [round(r) for r in rates["bare"]],
        "engine_over_bare": round(engine_rate / bare_rate, 3),
        "target": ">= 0.90",
    }


def swap_phase(args: argparse.Namespace) -> dict:
    import torch
    from safetensors.torch import load_file, save

    from engines.interface import Sampling

    engine, prompts = vllm_engine_and_prompts(args)
    state = load_file(str(args.model_dir / "model.safetensors"))
    swap_s = []
    for version in range(1, args.rounds + 1):
        perturbed = {name: tensor + 1e-3 * torch.randn_like(tensor) for name, tensor in state.items()}
        blob = save(perturbed)
        started_s = time.perf_counter()
        engine.load_weights(blob, version)
        swap_s.append(time.perf_counter() - started_s)
        engine.generate(prompts[:1], Sampling(1, 4, 1.0, greedy=True))  # it serves with the new weights
    return {
        "blob_bytes": len(blob),
        "swap_s": [round(s, 3) for s in swap_s],
        "window": "load_weights(blob): validate, write the local file, reload_weights, tied fix, prefix-cache reset",
    }


def learner_step_phase(args: argparse.Namespace) -> dict:
    import torch

    from benchmarks.gpu_check_parts import timed_steps
    from benchmarks.learner_memory import synthetic_batch
    from services.learner.policy import Policy
    from shared.config import GRPOConfig, LearnerConfig, RunConfig

    on_gpu = torch.cuda.is_available()
    learner = LearnerConfig(
        device="cuda" if on_gpu else "cpu",
        precision="mixed" if on_gpu else "fp32",
        micro_batch_size=args.micro_batch_size,
    )
    # the learner's own step (Policy.train_step: mixed precision's autocast is the policy's)
    policy = Policy(args.model_dir, RunConfig(run_id="bench-gpu", grpo=GRPOConfig(learning_rate=1e-6), learner=learner))
    num_rows, num_tokens, num_prompt_tokens = (64, 64, 16) if args.smoke else (512, 300, 44)
    batch = synthetic_batch(num_rows, num_tokens, num_prompt_tokens, policy.config.vocab_size)
    step_s = timed_steps(policy, batch, args.rounds)  # after one warm-up step (allocator, kernels)
    return {
        "rows": num_rows,
        "tokens_per_row": num_tokens,
        "micro_batch_size": args.micro_batch_size,
        "precision": learner.precision,
        "step_s": [round(s, 3) for s in step_s],
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / (1 << 30), 2) if on_gpu else None,
    }


def cluster_phase(args: argparse.Namespace) -> dict:
    from cluster.run_report import load_report

    run_id = f"bench-gpu-{int(time.time())}"
    config = REPO_ROOT / "configs" / ("gpu_smoke_cpu.toml" if args.smoke else "gpu_smoke.toml")
    command = [sys.executable, "-m", "cluster.local", "--config", str(config), "--workers", "1"]
    command += ["--model-dir", str(args.model_dir), "--run-id", run_id]
    started_s = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    report_path = REPO_ROOT / "runs" / run_id / "report.json"
    if done.returncode != 0 or not report_path.exists():
        raise RuntimeError(f"cluster run failed ({done.returncode}): {done.stdout[-800:]} {done.stderr[-800:]}")
    report = load_report(report_path)
    return {
        "run_id": run_id,
        "runner_wall_s": round(time.perf_counter() - started_s, 1),
        "num_steps": report.num_steps,
        "wall_s": report.wall_s,
        "learner_busy_fraction": report.learner_busy_fraction,
        "reward_mean_first10": report.reward_mean_first10,
        "reward_mean_last10": report.reward_mean_last10,
        "max_trained_staleness": report.max_trained_staleness,
        "num_dead_letters": report.num_dead_letters,
    }


def vllm_engine_and_prompts(args: argparse.Namespace):  # type: ignore[no-untyped-def]  # vllm types stay in the child
    from engines.select import build_engine
    from shared.config import RolloutConfig
    from shared.tasks import make_task

    rollout = RolloutConfig(engine="vllm", vllm_gpu_memory_utilization=0.5)
    engine = build_engine("vllm", args.model_dir, rollout, num_threads=max(1, (os.cpu_count() or 2) - 1))
    task = make_task("arithmetic_mod10", num_eval_prompts=1, seed=0)
    prompts = [task.sample_prompt().prompt for _ in range(args.num_prompts)]
    return engine, prompts


CHILDREN = {
    "generation": generation_phase,
    "swap": swap_phase,
    "learner_step": learner_step_phase,
    "cluster": cluster_phase,
}

if __name__ == "__main__":
    main()
