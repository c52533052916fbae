"""Delta size of a policy version at real learning rates: every codec of shared/delta.py, and the pick.

    python -m benchmarks.delta_size          # make bench-delta; writes benchmarks/results/delta_size.json

A Qwen3-style causal LM of ~128M parameters (hidden 768, 12 layers, vocab 32k, tied embeddings,
random init from a fixed seed, no download) takes real AdamW steps (the learner's settings:
services/learner/trainer.make_optimizer, weight decay 0.0, gradients clipped to norm 1.0) on next-token
cross entropy over random token batches (2 x 128), at each learning rate, in two precision set-ups:

    (a) bf16      the learner today: parameters in bf16, AdamW (and its moments) in bf16
    (b) fp32      fp32 master weights and AdamW; the published weights are their bf16 cast

After `--warmup-steps`, the published weights are serialised exactly like the learner
(services/learner/publish.serialize_weights) after each of `--steps` steps, and every consecutive pair
of versions is encoded with every codec (size, encode and decode seconds) and with encode_smallest.

On this CPU a bf16 matmul is ~30x slower than fp32 (no bf16 units), so in set-up (a) the gradient is
computed by an fp32 copy of the bf16 weights (exact: bf16 -> fp32 is lossless) and cast to bf16; the
update itself, which decides which bf16 words change, is the learner's: AdamW on bf16 parameters.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from services.learner.publish import serialize_weights
from shared.delta import CODECS, apply_delta, encode_smallest, encode_with

RESULTS = Path(__file__).resolve().parent / "results" / "delta_size.json"
MODEL_CONFIG = {
    "vocab_size": 32_000,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
}
WEIGHT_DECAY = 0.0  # GRPOConfig.weight_decay default and configs/qwen3.toml
MAX_GRAD_NORM = 1.0  # GRPOConfig.max_grad_norm


class Trainer:
    """An fp32 model that computes gradients and a bf16 model that is published, for one (set-up, lr)."""

    def __init__(self, setup: str, lr: float, compute: torch.nn.Module, published: torch.nn.Module, init: dict) -> None:
        self.setup, self.compute, self.published = setup, compute, published
        compute.load_state_dict(init)
        published.load_state_dict(init)  # cast to bf16
        trained = published if setup == "bf16" else compute  # whose parameters AdamW owns
        self.optimizer = torch.optim.AdamW(trained.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)

    def step(self, step_index: int, batch_size: int, seq_len: int) -> float:
        generator = torch.Generator().manual_seed(step_index)  # the same batches for every set-up and lr
        input_ids = torch.randint(0, MODEL_CONFIG["vocab_size"], (batch_size, seq_len), generator=generator)
        if self.setup == "bf16":
            with torch.no_grad():  # the fp32 compute copy of the bf16 weights (lossless)
                for full, half in zip(self.compute.parameters(), self.published.parameters(), strict=True):
                    full.copy_(half)
        self.compute.zero_grad(set_to_none=True)
        loss = self.compute(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        if self.setup == "bf16":
            for full, half in zip(self.compute.parameters(), self.published.parameters(), strict=True):
                half.grad = full.grad.to(torch.bfloat16) if full.grad is not None else None
            torch.nn.utils.clip_grad_norm_(self.published.parameters(), MAX_GRAD_NORM)
        else:
            torch.nn.utils.clip_grad_norm_(self.compute.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.setup == "fp32":
            with torch.no_grad():  # publish the bf16 cast of the fp32 master weights
                for full, half in zip(self.compute.parameters(), self.published.parameters(), strict=True):
                    half.copy_(full)
        return float(loss.detach())


def measure_pair(base: bytes, target: bytes) -> dict:
    """Changed 16-bit words, and per codec: size fraction, encode and decode seconds; then the pick."""
    changed = np.frombuffer(base, dtype=np.uint16) != np.frombuffer(target, dtype=np.uint16)
    row: dict = {"full_bytes": len(target), "changed_fraction_16bit": round(float(changed.mean()), 6), "codecs": {}}
    for codec in CODECS:
        started_s = time.perf_counter()
        delta = encode_with(codec, base, target)
        encode_s = time.perf_counter() - started_s
        started_s = time.perf_counter()
        rebuilt = apply_delta(base, delta)
        decode_s = time.perf_counter() - started_s
        assert rebuilt == target, codec
        row["codecs"][codec] = {
            "delta_bytes": len(delta),
            "size_fraction": round(len(delta) / len(target), 5),
            "encode_s": round(encode_s, 3),
            "decode_s": round(decode_s, 3),
        }
    started_s = time.perf_counter()
    chosen, delta = encode_smallest(base, target)
    encode_s = time.perf_counter() - started_s
    started_s = time.perf_counter()
    assert apply_delta(memoryview(base), memoryview(delta)) == target
    decode_s = time.perf_counter() - started_s
    row["chosen"] = {
        "codec": chosen,
        "size_fraction": round(len(delta) / len(target), 5),
        "encode_smallest_s": round(encode_s, 3),
        "decode_s": round(decode_s, 3),
    }
    return row


def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    config = Qwen3Config(**MODEL_CONFIG)
    compute = AutoModelForCausalLM.from_config(config)  # fp32, random init
    init = {name: tensor.clone() for name, tensor in compute.state_dict().items()}
    published = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    num_parameters = sum(parameter.numel() for parameter in compute.parameters())
    print(f"{num_parameters / 1e6:.1f}M parameters, torch {torch.__version__}", flush=True)
    runs = []
    for setup in args.setups:
        for lr in args.lrs:
            trainer = Trainer(setup, lr, compute, published, init)
            for step_index in range(args.warmup_steps):
                trainer.step(step_index, args.batch_size, args.seq_len)
            previous = serialize_weights(published)
            for step_index in range(args.warmup_steps, args.warmup_steps + args.steps):
                loss = trainer.step(step_index, args.batch_size, args.seq_len)
                blob = serialize_weights(published)
                row = {
                    "setup": setup,
                    "lr": lr,
                    "step": step_index,
                    "loss": round(loss, 4),
                    **measure_pair(previous, blob),
                }
                runs.append(row)
                print_row(row)
                previous = blob
    return {
        "command": " ".join(["python -m benchmarks.delta_size", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "host": {"cpus": os.cpu_count(), "torch_threads": args.threads, "python": platform.python_version()},
        "model_config": {"architecture": "Qwen3ForCausalLM", **MODEL_CONFIG},
        "num_parameters": num_parameters,
        "published_dtype": "bfloat16",
        "optimizer": {"name": "AdamW", "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM},
        "batch": {"batch_size": args.batch_size, "seq_len": args.seq_len},
        "warmup_steps": args.warmup_steps,
        "runs": runs,
        "summary": summarise(runs),
    }


def summarise(runs: list[dict]) -> list[dict]:
    """Per (set-up, lr): the mean over its version pairs."""
    summary = []
    for key in dict.fromkeys((row["setup"], row["lr"]) for row in runs):
        rows = [row for row in runs if (row["setup"], row["lr"]) == key]
        summary.append(
            {
                "setup": key[0],
                "lr": key[1],
                "num_pairs": len(rows),
                "changed_fraction_16bit": mean(row["changed_fraction_16bit"] for row in rows),
                **{codec: mean(row["codecs"][codec]["size_fraction"] for row in rows) for codec in CODECS},
                "chosen": sorted({row["chosen"]["codec"] for row in rows}),
                "chosen_size_fraction": mean(row["chosen"]["size_fraction"] for row in rows),
                "encode_smallest_s": mean(row["chosen"]["encode_smallest_s"] for row in rows),
                "decode_s": mean(row["chosen"]["decode_s"] for row in rows),
            }
        )
    return summary


def mean(values: object) -> float:
    return round(float(np.mean(list(values))), 5)  # type: ignore[call-overload]


def print_row(row: dict) -> None:
    sizes = "  ".join(f"{codec.split('-')[0]} {row['codecs'][codec]['size_fraction']:.4f}" for codec in CODECS)
    chosen = row["chosen"]
    print(
        f"{row['setup']:>4} lr {row['lr']:.0e} step {row['step']}: changed {row['changed_fraction_16bit']:.4f}  "
        f"{sizes}  -> {chosen['codec'].split('-')[0]} {chosen['size_fraction']:.4f} "
        f"(encode {chosen['encode_smallest_s']:.2f}s, decode {chosen['decode_s']:.2f}s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setups", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-6, 1e-5])
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="measured steps: one version pair each")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result["summary"], indent=1))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
