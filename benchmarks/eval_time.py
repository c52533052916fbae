"""Held-out evaluation time on the workers' engine: 20 prompts x 256 new tokens, greedy, on one model, repeated,
compared with the committed result (benchmarks/results/eval_time.json) where it measured the same shape.

    python -m benchmarks.eval_time                   # or: make bench-eval
    python -m benchmarks.eval_time --repeats 5 --max-new-tokens 128

What is timed: services/learner/evaluator.py's work, i.e. load the snapshot into the TorchEngine
(engines/torch_engine.py) and evaluate_greedy on it (KV cache, all prompts in one left-padded batch).

Every completion is forced to the full 256 tokens (an EOS set that never matches: a random model would
otherwise stop at an EOS by chance). The model is the demo's tiny random Qwen2 (configs/demo.toml: hidden 64,
2 layers, character tokenizer) with 512 positions so that prompt + 256 tokens fit; `--hidden-size/--num-layers`
size it up. The prompts are the arithmetic task's 20 held-out prompts. The engine's greedy tokens are checked
against transformers' own `generate` (do_sample off) on the learner's model, prompt by prompt (reported).

Also measured: the learner's stall per evaluation, i.e. how long Evaluator.submit blocks the training loop:
when the eval thread is idle (the snapshot of the weights: the common case), and when the previous evaluation
is still running (then it waits at most --max-stall-s and skips). Writes benchmarks/results/eval_time.json.
(Until 2026-11-28 this benchmark also ran the learner's evaluation of an older commit, read from git, side by
side; the committed eval_time_h128.json is such a run.)
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

import torch

from benchmarks.result_file import write_result

RESULTS = Path("benchmarks/results/eval_time.json")


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
    parser.add_argument("--repeats", type=int, default=3, help="timed evaluations")
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
    committed = committed_median_s(args.out, args)
    task = make_task("arithmetic_mod10", num_eval_prompts=args.num_prompts, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", args.hidden_size, args.num_layers)
        model, tokenizer = load_policy(model_dir)  # the learner's training model (float32, CPU here)
        engine = TorchEngine(model_dir)
        engine.eos_token_ids = torch.tensor([], dtype=torch.long)  # never stops: every row decodes max_new_tokens

        same_tokens = compare_tokens(model, tokenizer, task, engine, args.max_new_tokens)
        runs_s: list[float] = []
        for repeat in range(args.repeats):
            started_s = time.perf_counter()
            engine.load_state_dict(model.state_dict(), policy_version=1)  # what the eval thread does first
            evaluate_greedy(engine, task, max_new_tokens=args.max_new_tokens)
            runs_s.append(time.perf_counter() - started_s)
            print(f"repeat {repeat + 1}: {runs_s[-1]:.2f}s", flush=True)

        stall = measure_stall(Evaluator, engine, task, model, args.max_new_tokens, args.max_stall_s)

    median_s = statistics.median(runs_s)
    result = {
        "command": "python -m benchmarks.eval_time " + " ".join(sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average_1m": os.getloadavg()[0],
        },
        "model": {
            "architecture": "qwen2 (random init, character tokenizer: the demo's)",
            "hidden_size": args.hidden_size,
            "num_layers": args.num_layers,
            "num_parameters": sum(p.numel() for p in model.parameters()),
        },
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "forced_length": "EOS set emptied: every completion is max_new_tokens long",
        "same_completions_as_transformers_generate": same_tokens,
        "path": "TorchEngine.load_state_dict + evaluate_greedy (KV cache, on the eval thread)",
        "runs_s": runs_s,
        "median_s": median_s,
        "committed_median_s": committed,
        "vs_committed": None if committed is None else median_s / committed,
        "stall": stall,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result)
    versus = "" if committed is None else f" ({median_s / committed:.2f}x the committed {committed:.2f}s)"
    print(
        f"{args.num_prompts} prompts x {args.max_new_tokens} tokens: {median_s:.2f}s{versus}; "
        f"same completions as transformers' generate: {same_tokens}"
    )
    print(
        f"training-loop stall per eval: {stall['idle_median_s'] * 1000:.1f} ms when the eval thread is idle; "
        f"{stall['busy_s']:.2f}s (skipped: {not stall['busy_accepted']}) when the previous eval still runs "
        f"with budget {stall['busy_budget_s']}s; wrote {args.out}"
    )


def committed_median_s(path: Path, args: argparse.Namespace) -> float | None:
    """The committed result's engine-path median for the same model shape and workload, if there is one."""
    if not path.exists():
        return None
    committed = json.loads(path.read_text())
    same_shape = (
        committed.get("model", {}).get("hidden_size") == args.hidden_size
        and committed.get("model", {}).get("num_layers") == args.num_layers
        and committed.get("num_prompts") == args.num_prompts
        and committed.get("max_new_tokens") == args.max_new_tokens
    )
    value = committed.get("median_s", committed.get("new_median_s"))  # new_median_s: the file's earlier format
    return float(value) if same_shape and value is not None else None


def compare_tokens(model, tokenizer, task, engine, max_new_tokens: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether the engine's greedy tokens are transformers' own greedy `generate` on the same weights, per prompt."""
    from engines.interface import Sampling
    from shared.tokenization import encode_prompt

    engine.load_state_dict(model.state_dict(), policy_version=0)
    ours = engine.generate([item.input for item in task.eval_set], Sampling(1, max_new_tokens, 1.0, greedy=True))
    for item, (sample,) in zip(task.eval_set, ours, strict=True):
        prompt = torch.tensor([encode_prompt(tokenizer, item.input)])
        with torch.no_grad():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        if out[0, prompt.shape[1] :].tolist() != list(sample.token_ids):
            return False
    return True


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
