"""Peak memory of one learner step at Qwen's 151,936-token vocabulary: the old path (one forward to
(B, T, V) logits, a float32 log_softmax over all of them, the whole batch at once) against the new one
(decoder body once, LM head in chunks of positions, micro-batches with gradient accumulation).

    python -m benchmarks.learner_memory                # or: make bench-learner-memory
    python -m benchmarks.learner_memory --new-rows 512 --new-tokens 300 --timeout-s 900

The model is a random-init Qwen2 built here (hidden 64, 2 layers, tied embeddings, no hub): the
vocabulary, not the body, is what the old path's memory grows with. Each measurement is one training
step (forward, backward, AdamW) in a fresh subprocess, reported as the peak RSS of that process
(ru_maxrss) and its growth over the RSS just before the step (model, optimizer and batch built).
Every subprocess runs under a time limit and an address-space limit (--max-memory-gib, default 16 of
the machine's 24 GiB), so the old path cannot take the machine down: it is measured at a few small
row x token counts and its per-(row x token) slope is fitted, which extrapolates to the demo batch
(512 rows x 300 tokens). Writes benchmarks/results/learner_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.result_file import write_result

if TYPE_CHECKING:
    from services.learner.batch import TrainBatch

QWEN_VOCAB = 151_936
RESULTS = Path("benchmarks/results/learner_memory.json")
GIB = 1 << 30


def measure_step(path: str, num_rows: int, num_tokens: int, micro_batch_size: int, chunk_tokens: int) -> dict:
    """One training step in this process; returns its peak RSS and timing (run in a fresh subprocess)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from services.learner.grpo import full_token_logprobs, policy_loss
    from services.learner.trainer import make_optimizer, train_step
    from shared.config import GRPOConfig, LearnerConfig

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(num_tokens, 32),
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    grpo = GRPOConfig()
    optimizer = make_optimizer(model, grpo)
    num_prompt_tokens = min(20, num_tokens // 2)  # completion tokens are the rest of each row
    batch = synthetic_batch(num_rows, num_tokens, num_prompt_tokens, QWEN_VOCAB)
    before_kib = current_rss_kib()
    started_s = time.perf_counter()
    if path == "old":  # the learner before this change: trainer.train_step as it was
        model.train()
        logprobs = full_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures)
        loss, _ = policy_loss(
            logprobs,
            logprobs.detach(),
            batch.behaviour_logprobs,
            batch.advantages,
            batch.completion_mask,
            clip_eps=grpo.clip_eps,
            max_importance_weight=grpo.max_importance_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.max_grad_norm)
        optimizer.step()
    else:
        learner = LearnerConfig(micro_batch_size=micro_batch_size, logprob_chunk_tokens=chunk_tokens)
        train_step(model, optimizer, batch, grpo, learner)
    step_s = time.perf_counter() - started_s
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "path": path,
        "num_rows": num_rows,
        "num_tokens": num_tokens,
        "num_row_tokens": num_rows * num_tokens,
        "micro_batch_size": micro_batch_size if path == "new" else 0,
        "logprob_chunk_tokens": chunk_tokens if path == "new" else 0,
        "rss_before_step_gib": round(before_kib / (1 << 20), 3),
        "peak_rss_gib": round(peak_kib / (1 << 20), 3),
        "step_rss_growth_gib": round((peak_kib - before_kib) / (1 << 20), 3),
        "step_s": round(step_s, 2),
    }


def synthetic_batch(num_rows: int, num_tokens: int, num_prompt_tokens: int, vocab_size: int) -> TrainBatch:
    """A training batch of random tokens: every row `num_tokens` long, the first `num_prompt_tokens`
    of each the prompt, the rest its completion (what one learner step costs, not what it learns)."""
    import torch

    from services.learner.batch import TrainBatch

    completion_mask = torch.zeros((num_rows, num_tokens - 1), dtype=torch.bool)
    completion_mask[:, num_prompt_tokens - 1 :] = True
    return TrainBatch(
        input_ids=torch.randint(0, vocab_size, (num_rows, num_tokens)),
        attention_mask=torch.ones((num_rows, num_tokens), dtype=torch.long),
        completion_mask=completion_mask,
        behaviour_logprobs=torch.full((num_rows, num_tokens - 1), -12.0) * completion_mask,
        advantages=torch.randn((num_rows, 1)),
        temperatures=torch.ones(num_rows),
        rewards=torch.rand(num_rows),
    )


def current_rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def run_child(args: argparse.Namespace, path: str, num_rows: int, num_tokens: int) -> dict:
    """`measure_step` in a fresh, time- and memory-bounded subprocess; a failure comes back as a record."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.learner_memory",
        "--child",
        path,
        str(num_rows),
        str(num_tokens),
        "--micro-batch-size",
        str(args.micro_batch_size),
        "--chunk-tokens",
        str(args.chunk_tokens),
        "--max-memory-gib",
        str(args.max_memory_gib),
        "--threads",
        str(args.threads),
    ]
    label = f"{path} {num_rows} rows x {num_tokens} tokens"
    print(f"  {label} ...", flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return {"path": path, "num_rows": num_rows, "num_tokens": num_tokens, "error": f"over {args.timeout_s}s"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return {"path": path, "num_rows": num_rows, "num_tokens": num_tokens, "error": " ".join(tail)[:300]}
    record = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"    peak {record['peak_rss_gib']} GiB (+{record['step_rss_growth_gib']} in the step), {record['step_s']}s")
    return record


def fit_slope(records: list[dict]) -> float | None:
    """Least-squares GiB per (row x token) of the step's RSS growth."""
    points = [(r["num_row_tokens"], r["step_rss_growth_gib"]) for r in records if "error" not in r]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-sizes", default="8x32,16x32,32x32", help="rows x tokens for the old path")
    parser.add_argument("--new-sizes", default="32x32,64x300,512x300", help="rows x tokens for the new path")
    parser.add_argument("--micro-batch-size", type=int, default=32, help="new path: rows per forward")
    parser.add_argument("--chunk-tokens", type=int, default=1024, help="new path: logprob_chunk_tokens")
    parser.add_argument("--max-memory-gib", type=float, default=16.0, help="address-space limit of each child")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="time limit of each child")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each child")
    parser.add_argument("--child", nargs=3, metavar=("PATH", "ROWS", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        limit = int(args.max_memory_gib * GIB)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # an allocation past it fails, not the machine
        import torch

        torch.set_num_threads(args.threads)
        path, num_rows, num_tokens = args.child[0], int(args.child[1]), int(args.child[2])
        print(json.dumps(measure_step(path, num_rows, num_tokens, args.micro_batch_size, args.chunk_tokens)))
        return

    def sizes(text: str) -> list[tuple[int, int]]:
        return [(int(rows), int(tokens)) for rows, tokens in (item.split("x") for item in text.split(","))]

    print(f"one learner step, vocabulary {QWEN_VOCAB}, each in a fresh subprocess:")
    old = [run_child(args, "old", rows, tokens) for rows, tokens in sizes(args.old_sizes)]
    new = [run_child(args, "new", rows, tokens) for rows, tokens in sizes(args.new_sizes)]
    slope = fit_slope(old)
    demo_row_tokens = 512 * 300
    result = {
        "vocab_size": QWEN_VOCAB,
        "model": "Qwen2, hidden 64, intermediate 256, 2 layers, tied embeddings, float32, CPU",
        "command": "python -m benchmarks.learner_memory " + " ".join(sys.argv[1:]),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "old_path": old,
        "new_path": new,
        "old_path_gib_per_row_token": slope,
        "old_path_demo_batch_extrapolated_gib": round(slope * demo_row_tokens, 1) if slope else None,
        "demo_batch": "512 rows x 300 tokens",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS, result)
    if slope:
        print(f"old path: {slope * 1024:.2f} MiB per row x token -> ~{slope * demo_row_tokens:.0f} GiB at 512 x 300")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
