"""One tokenizer policy for the learner and the rollout workers: padding, EOS, prompt encoding, and
the fingerprint that says two processes hold the same model.

Evaluation and training must see the same token ids for the same prompt and stop at the same
tokens, so every rule that turns a prompt into ids, picks the pad id, or decides what ends a
completion lives here, once. Both the learner (`services/learner/`) and the workers
(`services/rollout/`) call it; neither imports the other.

This module imports neither torch nor transformers: it takes the tokenizer as an argument and reads
the folder's JSON files itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.messages import ChatMessage, TaskGroup

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Files that define how text becomes ids (whichever of them the folder has).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
# config.json fields that decide whether a weights blob fits a model and means the same thing there.
ARCHITECTURE_FIELDS = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
    "rope_theta",
    "rope_scaling",
    "hidden_act",
    "rms_norm_eps",
    "n_embd",
    "n_layer",
    "n_head",
    "n_positions",
)


class ModelFolderError(ValueError):
    """The model folder is not a usable Hugging Face causal LM with its tokenizer."""


class PromptEncodingError(ValueError):
    """A prompt the tokenizer cannot turn into ids the model would see exactly."""


class ChatTemplateError(PromptEncodingError):
    """The tokenizer's chat template failed to render the task's messages."""


@dataclass(frozen=True)
class PromptInput:
    """A prompt as the tokenizer sees it: raw text, and the chat messages it came from (if any).

    With messages and a tokenizer that has a chat template, the template renders the messages (with
    the generation prompt); otherwise `text` is encoded as is."""

    text: str
    messages: tuple[ChatMessage, ...] = ()

    @classmethod
    def of_task(cls, task: TaskGroup) -> PromptInput:
        return cls(task.prompt, tuple(task.messages))


def as_prompt_input(prompt: str | PromptInput) -> PromptInput:
    return prompt if isinstance(prompt, PromptInput) else PromptInput(prompt)


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that fills padding: the tokenizer's pad token, else its EOS (Llama-3, Mistral and GPT-2
    bases have no pad token). Padding is always masked out, so which token fills it does not matter,
    only that learner and workers agree and that it is a valid id."""
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    if pad is None:
        raise ModelFolderError(f"{tokenizer.name_or_path}: the tokenizer has neither a pad nor an eos token")
    return int(pad)


def eos_token_ids(model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's (instruct
    models list several, e.g. <|endoftext|> and <|im_end|>). generation_config.json wins over
    config.json's eos_token_id, as in transformers' own generation."""
    ids = set(generation_eos_ids(model_dir))
    _add_ids(ids, tokenizer.eos_token_id)
    if not ids:
        raise ModelFolderError(f"{model_dir}: no EOS token in the tokenizer or the generation config")
    return frozenset(ids)


def generation_eos_ids(model_dir: Path) -> frozenset[int]:
    """The EOS ids the folder's generation config lists (generation_config.json, else config.json);
    `eos_token_ids` adds the tokenizer's own EOS. Also used without transformers (services/reward/decode.py)."""
    ids: set[int] = set()
    generation = _read_json(model_dir / "generation_config.json")
    source = (
        generation if generation is not None and "eos_token_id" in generation else _read_json(model_dir / "config.json")
    )
    if source is not None:
        _add_ids(ids, source.get("eos_token_id"))
    return frozenset(ids)


def tokenizer_eos_token(model_dir: Path) -> str | None:
    """The tokenizer's EOS token as text, read as transformers reads it (tokenizer_config.json, else
    special_tokens_map.json; a string or an AddedToken map), for processes without transformers."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        token = (_read_json(model_dir / name) or {}).get("eos_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and token:
            return token
    return None


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json of the folder ({} when absent)."""
    return _read_json(model_dir / "config.json") or {}


def checkpoint_dtype_name(model_dir: Path) -> str:
    """The dtype config.json says the folder's weights are in ("bfloat16", "float16", "float32"; float32 when
    it names none): what the learner publishes versions in and the workers' engines compute in."""
    config = read_config(model_dir)
    return str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | PromptInput) -> list[int]:
    """The prompt's token ids, the one way training and evaluation both use.

    Chat messages with a chat template: rendered with the generation prompt, then encoded without
    adding special tokens (the template writes its own BOS/markers). Raw text: encoded with the
    tokenizer's own special tokens (e.g. a BOS), as the model saw text in pre-training.
    Raises PromptEncodingError for a prompt the tokenizer cannot represent exactly, ChatTemplateError
    for a template that fails to render; never falls back silently."""
    prompt = as_prompt_input(prompt)
    if prompt.messages and getattr(tokenizer, "chat_template", None):
        # The contents are checked, not the rendered text: SentencePiece tokenizers decode the
        # template's markers with spacing of their own, which is no loss of the task's text.
        for message in prompt.messages:
            if message.content:
                _check_representable(tokenizer, message.content)
        text = render_chat(tokenizer, prompt.messages)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    _check_representable(tokenizer, prompt.text)
    return list(tokenizer(prompt.text, add_special_tokens=True)["input_ids"])


def encode_observation(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """The ids an environment's observation adds to an episode's context: the text encoded alone, with
    no special tokens (it continues a sequence). The reward service encodes a replayed observation the
    same way (`tokenizers`' encode without special tokens) to check a worker's environment tokens.
    Empty text: no ids. Raises PromptEncodingError for text the tokenizer cannot represent exactly."""
    if not text:
        return []
    _check_representable(tokenizer, text)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[ChatMessage]) -> str:
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja raises its own errors (TemplateError, UndefinedError, ...) from user templates
        raise ChatTemplateError(
            f"the chat template failed on {conversation!r:.120}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(text, str) or not text:
        raise ChatTemplateError(f"the chat template rendered {text!r:.80} for {conversation!r:.120}")
    return text


def model_fingerprint(model_dir: Path) -> str:
    """sha256 over the tokenizer files' bytes and config.json's architecture fields.

    Two processes with the same fingerprint turn text into the same ids and accept the same weights
    with the same meaning; a worker refuses weights published under another fingerprint."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    config = _read_json(model_dir / "config.json") or {}
    architecture = {key: config[key] for key in ARCHITECTURE_FIELDS if key in config}
    digest.update(json.dumps(architecture, sort_keys=True).encode())
    return digest.hexdigest()


def check_model_folder(model_dir: Path) -> None:
    """Raise ModelFolderError unless `model_dir` holds a causal-LM config and a tokenizer (checked
    before anything heavy loads, so a wrong path is one clear line, not a traceback from transformers)."""
    if not model_dir.is_dir():
        raise ModelFolderError(f"model folder {model_dir} does not exist")
    config = _read_json(model_dir / "config.json")
    if config is None:
        raise ModelFolderError(f"{model_dir} has no config.json: not a Hugging Face model folder")
    if "model_type" not in config:
        raise ModelFolderError(f"{model_dir}/config.json has no model_type")
    architectures = config.get("architectures") or []
    if architectures and not any(str(name).endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        raise ModelFolderError(f"{model_dir} is a {architectures} model, not a causal LM")
    if not any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ModelFolderError(f"{model_dir} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")


def _check_representable(tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    # Tokenizers drop or map to <unk> what they cannot represent; a prompt the model cannot see
    # exactly must fail loudly rather than be sampled (or evaluated) as something else.
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoded = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if not ids or decoded != text:
        raise PromptEncodingError(f"the tokenizer cannot represent prompt {text[:80]!r}")


def _add_ids(ids: set[int], source: Any) -> None:
    if isinstance(source, int):
        ids.add(source)
    elif isinstance(source, list | tuple):
        ids.update(int(i) for i in source)


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None
