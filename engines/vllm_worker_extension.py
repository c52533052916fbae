"""Methods vLLM adds to its worker (`LLM(worker_extension_cls="engines.vllm_worker_extension.WorkerExtension")`);
the engine calls them through `llm.collective_rpc`, with plain arguments only (a file path), so the
same call works whether the worker runs in the engine's process or in its own.

    reload_weights_from_file  a received version, in place (load_weights)
    install_keyed_sampler     seeded requests sampled by keyed sampling (engines/vllm_keyed_sampler.py), once at start

Imported by vLLM inside the worker by qualified name: it must stay importable on its own, and it
imports nothing from vLLM at module level.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class WorkerExtension:
    """Mixed into vLLM's worker class: `self` is the worker (it has `reload_weights` and `model_runner`)."""

    def reload_weights_from_file(self, path: str, tie_word_embeddings: bool) -> int:
        """Load the safetensors file at `path` (checkpoint names) into the running model, in place.

        Why this route: on CPU vLLM prepacks linear weights after loading, so writing into parameters
        (`model.load_weights`, `param.copy_`) leaves the packed copies stale; the worker's
        `reload_weights` re-runs every layer's post-load processing. Returns the number of tensors."""
        worker: Any = self
        num_tensors = 0

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal num_tensors
            from safetensors import safe_open

            with safe_open(path, framework="pt") as checkpoint:
                for name in checkpoint.keys():  # noqa: SIM118  # safe_open is not a mapping
                    num_tensors += 1
                    yield name, checkpoint.get_tensor(name)

        worker.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        if tie_word_embeddings:
            # The output head shares the embedding's weight, but its prepacked copy for the logits
            # matmul is only rebuilt by the head's own post-load step (without it, log-probs are off
            # by ~1.5 nats on CPU; docs/engines.md).
            lm_head = getattr(worker.model_runner.get_model(), "lm_head", None)
            quant_method = getattr(lm_head, "quant_method", None)
            if quant_method is not None:
                quant_method.process_weights_after_loading(lm_head)
        return num_tensors

    def install_keyed_sampler(self) -> None:
        """Seeded requests get keyed sampling's tokens (engines/vllm_keyed_sampler.py); once, after start-up."""
        from engines.vllm_keyed_sampler import install_keyed_sampler

        worker: Any = self
        install_keyed_sampler(worker.model_runner)
