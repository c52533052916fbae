"""Random-init model folders at the shapes the benchmarks quote, built locally (no hub).

    python -m benchmarks.model_shapes qwen3-0.6b /tmp/qwen3-0.6b --dtype bfloat16

Each folder is a Qwen3 causal LM with the task's character tokenizer (services/learner/model_init.py):
the tokenizer covers the arithmetic task's alphabet, the model keeps its real vocabulary size (Qwen3:
151,936 rows), so the LM head and the embeddings weigh what they do in the real checkpoint. The layer
shapes are Qwen3-0.6B's (hidden 1024, 28 layers, 16 query / 8 KV heads of 128, MLP 3072, tied
embeddings); "qwen3-25m" is a 25M-parameter model of the same family for CPU throughput figures, and
"qwen3-tiny" (2 layers, hidden 128) is what CPU smoke runs of the GPU scripts use.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        vocab_size=151_936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    "qwen3-25m": dict(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1792,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
    "qwen3-tiny": dict(
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
}


def build_qwen3_folder(
    shape: str, out_dir: Path, *, dtype: str = "float32", seed: int = 0, max_position_embeddings: int | None = None
) -> Path:
    """Tokenizer + random `shape` model in `out_dir` (created; reused when it already holds one).
    max_position_embeddings: the context the config declares, when longer sequences than the shape's
    own are trained (Qwen3-0.6B's real checkpoint declares 40,960; RoPE has no table to outgrow)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from services.learner.model_init import build_tokenizer
    from shared.tasks import TASKS

    if (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(TASKS["arithmetic_mod10"].alphabet, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    torch.manual_seed(seed)
    context = {} if max_position_embeddings is None else {"max_position_embeddings": max_position_embeddings}
    config = Qwen3Config(
        **(SHAPES[shape] | context),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def parameter_count(shape: str) -> int:
    """Parameters of `shape` (tied embeddings counted once), from the config alone."""
    s = SHAPES[shape]
    hidden, heads, kv_heads, head_dim = (
        s["hidden_size"],
        s["num_attention_heads"],
        s["num_key_value_heads"],
        s["head_dim"],
    )
    attention = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden + 2 * head_dim
    mlp = 3 * hidden * s["intermediate_size"]
    per_layer = attention + mlp + 2 * hidden
    return int(s["num_hidden_layers"] * per_layer + s["vocab_size"] * hidden + hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    print(
        build_qwen3_folder(args.shape, args.out, dtype=args.dtype),
        f"{parameter_count(args.shape) / 1e6:.1f}M parameters",
    )


if __name__ == "__main__":
    main()
