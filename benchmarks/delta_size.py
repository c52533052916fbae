"""Delta size of a policy version at real learning rates per learner precision, every codec of
shared/weight_channel/delta.py and the pick; with each precision's step time and learner bytes per parameter.

    python -m benchmarks.delta_size          # make bench-delta; writes benchmarks/results/delta_size.json

A Qwen3-style causal LM of ~128M parameters (hidden 768, 12 layers, vocab 32k, tied embeddings,
random init from a fixed seed, no download) takes real AdamW steps (the learner's settings:
services/learner/trainer.make_optimizer, weight decay 0.0, gradients clipped to norm 1.0) on next-token
cross entropy over random token batches (2 x 128), at each learning rate, in each `[learner] precision`
(services/learner/precision.py):

    mixed   float32 master weights and AdamW state, bf16 compute (autocast): the default for real models
    bf16    parameters, gradients and AdamW moments in bf16 (precision = "bf16")
    fp32    float32 throughout

Every precision publishes the bf16 rounding of its weights (a bf16 checkpoint's dtype). After
`--warmup-steps`, the published weights are serialised exactly like the learner
(services/learner/publish.serialize_weights) after each of `--steps` steps, and every consecutive pair
of versions is encoded with every codec (size, encode and decode seconds) and with encode_smallest.
Step time: forward, backward, clipping and the AdamW step of one batch (no publication), the mean over
the measured steps; bytes per parameter: the parameters, their gradients and the optimizer state.
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
from shared.weight_channel.delta import CODECS, apply_delta, encode_smallest, encode_with

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
    """One (precision, lr): the trained model, its optimizer, and the bf16 model it publishes."""

    def __init__(self, precision: str, lr: float, config: Qwen3Config, init: dict) -> None:
        self.precision = precision
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.model = AutoModelForCausalLM.from_config(config).to(dtype)
        self.model.load_state_dict(init)  # cast to the precision's dtype
        self.published = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
        self.step_s: list[float] = []

    def step(self, step_index: int, batch_size: int, seq_len: int) -> float:
        generator = torch.Generator().manual_seed(step_index)  # the same batches for every precision and lr
        input_ids = torch.randint(0, MODEL_CONFIG["vocab_size"], (batch_size, seq_len), generator=generator)
        started_s = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "mixed")
        with autocast:
            loss = self.model(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.step_s.append(time.perf_counter() - started_s)
        with torch.no_grad():  # what is published: the bf16 rounding of the weights
            self.published.load_state_dict(self.model.state_dict())
        return float(loss.detach())

    def bytes_per_parameter(self) -> float:
        parameters = list(self.model.parameters())
        num_bytes = sum(p.numel() * p.element_size() for p in parameters)
        num_bytes += sum(p.grad.numel() * p.grad.element_size() for p in parameters if p.grad is not None)
        for state in self.optimizer.state.values():
            num_bytes += sum(t.numel() * t.element_size() for t in state.values() if t.dim() > 0)
        return num_bytes / sum(p.numel() for p in parameters)


def time_precisions(config: Qwen3Config, init: dict, args: argparse.Namespace) -> list[dict]:
    """Step time per precision, side by side: one trainer each, warmed up by a step, then `timing_rounds`
    rounds in which every precision takes one step in turn, so a machine whose load drifts loads them
    alike. Per precision: the median step and its ratio to float32's."""
    trainers = {precision: Trainer(precision, args.lrs[0], config, init) for precision in args.precisions}
    for trainer in trainers.values():
        trainer.step(0, args.batch_size, args.seq_len)
        trainer.step_s.clear()
    for round_index in range(args.timing_rounds):
        for trainer in trainers.values():
            trainer.step(1 + round_index, args.batch_size, args.seq_len)
    medians = {precision: float(np.median(trainer.step_s)) for precision, trainer in trainers.items()}
    reference_s = medians.get("fp32")
    return [
        {
            "precision": precision,
            "step_s_median": round(median_s, 3),
            "step_s_all": [round(step_s, 3) for step_s in trainers[precision].step_s],
            "vs_fp32": round(median_s / reference_s, 3) if reference_s else None,
            "bytes_per_parameter": round(trainers[precision].bytes_per_parameter(), 2),
        }
        for precision, median_s in medians.items()
    ]


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
    init = dict(AutoModelForCausalLM.from_config(config).state_dict())  # fp32, random init
    num_parameters = sum(tensor.numel() for name, tensor in init.items() if name != "lm_head.weight")
    print(f"{num_parameters / 1e6:.1f}M parameters, torch {torch.__version__}", flush=True)
    runs, precisions = [], []
    for precision in [] if args.skip_deltas else args.precisions:
        for lr in args.lrs:
            trainer = Trainer(precision, lr, config, init)
            for step_index in range(args.warmup_steps):
                trainer.step(step_index, args.batch_size, args.seq_len)
            previous = serialize_weights(trainer.published)
            trainer.step_s.clear()  # warm-up steps are not timed
            for step_index in range(args.warmup_steps, args.warmup_steps + args.steps):
                loss = trainer.step(step_index, args.batch_size, args.seq_len)
                blob = serialize_weights(trainer.published)
                row = {"precision": precision, "lr": lr, "step": step_index, "loss": round(loss, 4)}
                row.update(measure_pair(previous, blob))
                runs.append(row)
                print_row(row)
                previous = blob
            precisions.append(
                {
                    "precision": precision,
                    "lr": lr,
                    "step_s_mean": round(float(np.mean(trainer.step_s)), 3),
                    "bytes_per_parameter": round(trainer.bytes_per_parameter(), 2),
                }
            )
            print(json.dumps(precisions[-1]), flush=True)
    step_times = time_precisions(config, init, args) if args.timing_rounds else []
    print(json.dumps(step_times), flush=True)
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
        "precisions": precisions,
        "step_times": step_times,
        "runs": runs,
        "summary": summarise(runs),
    }


def summarise(runs: list[dict]) -> list[dict]:
    """Per (set-up, lr): the mean over its version pairs."""
    summary = []
    for key in dict.fromkeys((row["precision"], row["lr"]) for row in runs):
        rows = [row for row in runs if (row["precision"], row["lr"]) == key]
        summary.append(
            {
                "precision": key[0],
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
        f"{row['precision']:>4} lr {row['lr']:.0e} step {row['step']}: changed {row['changed_fraction_16bit']:.4f}  "
        f"{sizes}  -> {chosen['codec'].split('-')[0]} {chosen['size_fraction']:.4f} "
        f"(encode {chosen['encode_smallest_s']:.2f}s, decode {chosen['decode_s']:.2f}s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", choices=("mixed", "bf16", "fp32"), default=["mixed", "bf16", "fp32"])
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-6, 1e-5])
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="measured steps: one version pair each")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--timing-rounds", type=int, default=5, help="round-robin steps per precision for the step times (0: none)"
    )
    parser.add_argument("--skip-deltas", action="store_true", help="only the step times and bytes per parameter")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result["summary"], indent=1))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
