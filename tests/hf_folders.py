"""Tiny Hugging Face causal-LM folders like the ones users bring (Qwen3/Llama/GPT-2 style), built
locally: a byte-level BPE tokenizer trained on a few strings, optionally with a BOS post-processor,
no pad token and a chat template, and a random tiny model. No hub access."""

from __future__ import annotations

import json
from pathlib import Path

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
BOS = "<s>"
PAD = "<pad>"

# Qwen-style: renders each turn between <|im_start|> and <|im_end|>, then opens the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A template that cannot render (a user's typo): it calls a filter jinja does not have.
BROKEN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] | no_such_filter }}{% endfor %}"

TRAINING_TEXT = [
    "0+1=1 2+3=5 4+5=9 6+7=3 8+9=7 123>321 456>654 789>987",
    "user assistant system hello what is the answer",
    "The quick brown fox jumps over the lazy dog.",
]


def build_bpe_tokenizer(
    out_dir: Path,
    *,
    with_pad: bool = True,
    with_bos: bool = False,
    chat_template: str | None = None,
) -> None:
    """A byte-level BPE tokenizer folder; eos <|endoftext|>; <|im_end|> is a special token too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [ENDOFTEXT, IM_START, IM_END, BOS, *([PAD] if with_pad else [])]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    if with_bos:
        bos_id = tokenizer.token_to_id(BOS)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=ENDOFTEXT,
        bos_token=BOS if with_bos else None,
        pad_token=PAD if with_pad else None,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        wrapped.chat_template = chat_template
    wrapped.save_pretrained(out_dir)


def build_tiny_model(
    out_dir: Path,
    *,
    architecture: str = "qwen3",
    generation_eos: list[int] | None = None,
    max_position_embeddings: int = 64,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    head_dim: int = 16,
) -> None:
    """A random tiny causal LM sized to the tokenizer in `out_dir`; `generation_eos` goes into
    generation_config.json (instruct checkpoints list several EOS ids there)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    torch.manual_seed(seed)
    if architecture == "gpt2":
        config = AutoConfig.for_model(
            "gpt2", vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=max_position_embeddings
        )
    else:
        config = AutoConfig.for_model(
            architecture,
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=head_dim,
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=tie_word_embeddings,
        )
    config.eos_token_id = tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    if generation_eos is not None:
        (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))


def build_folder(
    out_dir: Path,
    *,
    architecture: str = "qwen3",
    with_pad: bool = True,
    with_bos: bool = False,
    chat_template: str | None = None,
    generation_eos_tokens: tuple[str, ...] = (),
    max_position_embeddings: int = 64,
    tie_word_embeddings: bool = True,
    head_dim: int = 16,
) -> Path:
    """Tokenizer + model in `out_dir` (created); returns it. `tie_word_embeddings` is for the
    Qwen/Llama shapes (GPT-2 always ties); vLLM's CPU attention needs `head_dim` >= 32."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    build_bpe_tokenizer(out_dir, with_pad=with_pad, with_bos=with_bos, chat_template=chat_template)
    generation_eos = None
    if generation_eos_tokens:
        tokenizer = AutoTokenizer.from_pretrained(out_dir)
        generation_eos = [tokenizer.convert_tokens_to_ids(token) for token in generation_eos_tokens]
    build_tiny_model(
        out_dir,
        architecture=architecture,
        generation_eos=generation_eos,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        head_dim=head_dim,
    )
    return out_dir


def build_char_folder(out_dir: Path, max_position_embeddings: int = 32, alphabet: str | None = None) -> Path:
    """The demo's character-level Qwen2 for the arithmetic task (16 tokens: EOS is frequent), or for another
    task's `alphabet`, with 2 heads of 32 (the demo's 4 heads of 16 have no vLLM CPU attention kernel)."""
    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tasks import TASKS

    config = ModelConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_position_embeddings
    )
    return build_initial_policy(config, alphabet or TASKS["arithmetic_mod10"].alphabet, out_dir)
