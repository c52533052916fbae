"""Held-out evaluation time, before and after it moved onto the workers' engine: 20 prompts x 256 new
tokens, greedy, on one model, side by side in one process, alternating old / new, repeated.

    python -m benchmarks.eval_time                   # or: make bench-eval
    python -m benchmarks.eval_time --repeats 5 --max-new-tokens 128

old  the learner's evaluation as of the base commit (BASE_COMMIT): services/learner/evaluate.py and
     services/learner/decode.py loaded from git as they were: no KV cache, the whole prefix re-run for
     every new token, prompts of equal length batched together.
new  services/learner/evaluator.py's work: load the snapshot into the TorchEngine (engines/torch_engine.py),
     evaluate_greedy on it: KV cache, all prompts in one left-padded batch.

Every completion is forced to the full 256 tokens: both paths get an EOS set that never matches (a random
model would otherwise stop at an EOS by chance, and the paths would decode different lengths). The model
is the demo's tiny random Qwen2 (configs/demo.toml: hidden 64, 2 layers, character tokenizer) with 512
positions so that prompt + 256 tokens fit; `--hidden-size/--num-layers` size it up. The prompts are the
arithmetic task's 20 held-out prompts. Both paths must produce the same tokens (reported).

Also measured: the learner's stall per evaluation with the new design, i.e. how long Evaluator.submit
blocks the training loop: when the eval thread is idle (the snapshot of the weights: the common case),
and when the previous evaluation is still running (then it waits at most --max-stall-s and skips).
Writes benchmarks/results/eval_time.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

from benchmarks.result_file import write_result

BASE_COMMIT = "b747aad"  # the last commit where evaluation decoded without a KV cache, in the learner loop
RESULTS = Path("benchmarks/results/eval_time.json")


def load_base_evaluate() -> types.ModuleType:
    """The base commit's services/learner/evaluate.py (and the decode.py it imports), as modules."""
    modules = {}
    for name, path in [
        ("services.learner.decode", "services/learner/decode.py"),
        ("base_evaluate", "services/learner/evaluate.py"),
    ]:
        source = subprocess.run(
            ["git", "show", f"{BASE_COMMIT}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        module = types.ModuleType(name)
        sys.modules[name] = module  # evaluate.py imports decode.py by this name
        exec(compile(source, f"{BASE_COMMIT}:{path}", "exec"), module.__dict__)
        modules[name] = module
    return modules["base_evaluate"]


def build_model(out_dir: Path, hidden_size: int, num_layers: int) -> Path:
    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tasks import TASKS

    config = ModelConfig(
        init="tiny-random",
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        max_position_embeddings=512,
    )
    return build_initial_policy(config, TASKS["arithmetic_mod10"].alphabet, out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each path (alternating)")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--hidden-size", type=int, default=64, help="64: the demo model")
    parser.add_argument("--num-layers", type=int, default=2, help="2: the demo model")
    parser.add_argument("--max-stall-s", type=float, default=5.0, help="[learner] eval_max_stall_s for the stall test")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    from engines.torch_engine import TorchEngine
    from services.learner.evaluate import evaluate_greedy
    from services.learner.evaluator import Evaluator
    from services.learner.trainer import load_policy
    from shared.tasks import make_task

    hf_logging.disable_progress_bar()
    base_evaluate = load_base_evaluate()
    task = make_task("arithmetic_mod10", num_eval_prompts=args.num_prompts, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", args.hidden_size, args.num_layers)
        model, tokenizer = load_policy(model_dir)  # the learner's training model (float32, CPU here)
        engine = TorchEngine(model_dir)
        engine.eos_token_ids = torch.tensor([], dtype=torch.long)  # never stops: every row decodes max_new_tokens

        def run_old() -> object:
            return base_evaluate.evaluate_greedy(
                model, tokenizer, task, max_new_tokens=args.max_new_tokens, eos_token_ids=set()
            )

        def run_new() -> object:
            engine.load_state_dict(model.state_dict(), policy_version=1)  # what the eval thread does first
            return evaluate_greedy(engine, task, max_new_tokens=args.max_new_tokens)

        same_tokens = compare_tokens(base_evaluate, model, tokenizer, task, engine, args.max_new_tokens)
        runs: dict[str, list[float]] = {"old_s": [], "new_s": []}
        for repeat in range(args.repeats):
            for key, fn in (("old_s", run_old), ("new_s", run_new)):
                started_s = time.perf_counter()
                fn()
                runs[key].append(time.perf_counter() - started_s)
            print(f"repeat {repeat + 1}: old {runs['old_s'][-1]:.2f}s  new {runs['new_s'][-1]:.2f}s", flush=True)

        stall = measure_stall(Evaluator, engine, task, model, args.max_new_tokens, args.max_stall_s)

    old_s, new_s = statistics.median(runs["old_s"]), statistics.median(runs["new_s"])
    result = {
        "command": "python -m benchmarks.eval_time " + " ".join(sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "model": {
            "architecture": "qwen2 (random init, character tokenizer: the demo's)",
            "hidden_size": args.hidden_size,
            "num_layers": args.num_layers,
            "num_parameters": sum(p.numel() for p in model.parameters()),
        },
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "forced_length": "EOS set emptied for both paths: every completion is max_new_tokens long",
        "same_completions": same_tokens,
        "old_path": f"{BASE_COMMIT}: services/learner/evaluate.py + decode.py (no KV cache, in the learner loop)",
        "new_path": "TorchEngine.load_state_dict + evaluate_greedy (KV cache, on the eval thread)",
        "runs_s": runs,
        "old_median_s": old_s,
        "new_median_s": new_s,
        "speedup": old_s / new_s,
        "stall": stall,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result)
    print(
        f"{args.num_prompts} prompts x {args.max_new_tokens} tokens: old {old_s:.2f}s, new {new_s:.2f}s "
        f"(x{old_s / new_s:.1f}); same completions: {same_tokens}"
    )
    print(
        f"training-loop stall per eval: {stall['idle_median_s'] * 1000:.1f} ms when the eval thread is idle; "
        f"{stall['busy_s']:.2f}s (skipped: {not stall['busy_accepted']}) when the previous eval still runs "
        f"with budget {stall['busy_budget_s']}s; wrote {args.out}"
    )


def compare_tokens(base_evaluate, model, tokenizer, task, engine, max_new_tokens: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether the old and the new path decode the same greedy tokens for every prompt."""
    from shared.tokenization import encode_prompt

    prompt_ids = [encode_prompt(tokenizer, item.input) for item in task.eval_set]
    old = base_evaluate.generate(
        model,
        prompt_ids,
        num_samples=1,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        eos_token_ids=set(),
        greedy=True,
    )
    engine.load_state_dict(model.state_dict(), policy_version=0)
    new = engine.generate([item.input for item in task.eval_set], 1, max_new_tokens, temperature=1.0, greedy=True)
    return [c.token_ids for (c,) in old] == [s.token_ids for (s,) in new]


def measure_stall(evaluator_class, engine, task, model, max_new_tokens: int, max_stall_s: float) -> dict:  # type: ignore[no-untyped-def]
    """How long Evaluator.submit blocks the caller: on an idle thread (three handoffs, each waited out),
    and once while the previous evaluation runs, with a budget of a quarter of its duration (a skip)."""
    records: list = []
    evaluator = evaluator_class(
        engine, task, max_new_tokens=max_new_tokens, on_record=records.append, wall_s=lambda: 0.0
    )
    try:
        idle_s, eval_s = [], []
        for version in range(3):
            handoff = evaluator.submit(model, version, max_wait_s=max_stall_s)
            assert handoff.accepted
            idle_s.append(handoff.stall_s)
            evaluator.wait_idle()
            eval_s.append(evaluator.take_finished()[-1].eval_s)
        budget_s = round(statistics.median(eval_s) / 4, 3)
        evaluator.submit(model, 3, max_wait_s=max_stall_s)
        busy = evaluator.submit(model, 4, max_wait_s=budget_s)
        evaluator.wait_idle()
    finally:
        evaluator.close()
    return {
        "idle_s": idle_s,
        "idle_median_s": statistics.median(idle_s),
        "eval_thread_s": eval_s,
        "busy_budget_s": budget_s,
        "busy_s": busy.stall_s,
        "busy_accepted": busy.accepted,
    }


if __name__ == "__main__":
    main()
