"""Build the run's initial policy as a Hugging Face causal-LM folder, locally: a character tokenizer
trained on the task's alphabet and a tiny Qwen2/Qwen3 with random weights. No hub access.

The folder (config.json, model.safetensors, tokenizer files) takes the same path through the
learner and the workers as a real checkpoint would.

    python -m services.learner.model_init --config configs/demo.toml --out runs/demo/model
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from shared.config import ModelConfig, load_run_config

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"


def build_tokenizer(alphabet: str, out_dir: Path) -> None:
    """A character-level tokenizer: one token per byte-level character of `alphabet` (one per character for
    ASCII), plus pad/eos/bos.

    It is written in the byte-level form Qwen's tokenizer class uses (a space is "Ġ", a newline "Ċ"; BPE
    without merges): AutoTokenizer rebuilds a qwen2/qwen3 folder's tokenizer with that class, which keeps
    the vocabulary but imposes its byte-level pre-tokenizer, so a plain character vocabulary would lose
    every space and newline of the chat tasks' prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    characters = sorted({symbol for character in set(alphabet) for symbol in byte_level(character)})
    vocab = {token: i for i, token in enumerate([PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, *characters])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=PAD_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(out_dir)


def byte_level(text: str) -> str:
    """`text` in GPT-2's byte-to-unicode alphabet (printable ASCII maps to itself, a space to "Ġ")."""
    return "".join(BYTE_TO_UNICODE[byte] for byte in text.encode())


def _byte_to_unicode() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


BYTE_TO_UNICODE = _byte_to_unicode()


def build_model(config: ModelConfig, vocab_size: int, pad_id: int, eos_id: int, bos_id: int, out_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(config.seed)
    hf_config = AutoConfig.for_model(
        config.architecture,
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        torch_dtype="float32",
    )
    model = AutoModelForCausalLM.from_config(hf_config)
    model.save_pretrained(out_dir, safe_serialization=True)


POLICY_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def holds_policy(folder: Path) -> bool:
    return all((folder / name).exists() for name in POLICY_FILES)


def build_initial_policy(config: ModelConfig, alphabet: str, out_dir: Path) -> Path:
    """The tokenizer + random-init model in `out_dir`, built once: a folder that already holds a policy is
    returned as it is, so a second `docker compose up` (or a resumed run) never rewrites the model a run's
    checkpoints and workers were built against. The folder appears whole or not at all: it is built in a
    sibling folder and renamed into place."""
    if holds_policy(out_dir):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} holds files but not a whole policy ({', '.join(POLICY_FILES)}): remove it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        _build_into(config, alphabet, building)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        building.rename(out_dir)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return out_dir


def _build_into(config: ModelConfig, alphabet: str, out_dir: Path) -> None:
    from transformers import AutoTokenizer

    build_tokenizer(alphabet, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    build_model(config, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("configs/demo.toml"), help="run TOML file")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the HF model into")
    args = parser.parse_args()
    from transformers.utils import logging as transformers_logging

    from shared.tasks import task_type

    transformers_logging.disable_progress_bar()
    run = load_run_config(args.config)
    existed = holds_policy(args.out)
    out = build_initial_policy(run.model, task_type(run.task.name).alphabet, args.out)
    print(f"{out} already holds the policy: left as it is" if existed else f"wrote {out}")


if __name__ == "__main__":
    main()
