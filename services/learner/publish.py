"""What the learner publishes of its model: the tensors of a version, handed to the weight channel.

    publication_state    the state dict in its wire names: the tied head left out, a LoRA model's adapter
                         only (services/learner/lora.py), floating tensors optionally in a dtype
    serialize_weights    those tensors as safetensors bytes (tests, tools, benchmarks)
    load_weights_blob    such bytes back into a model of the same architecture

The learner's loop hands `publication_state(policy)` to the weight channel's `WeightPublisher`
(shared/weight_channel/publisher.py), which serialises, signs, stores and announces it. A worker loads
the blob with its engine: safetensors, HF state-dict names, in the checkpoint's dtype (precision.py:
bfloat16 halves the bytes); a model with tied embeddings gets lm_head back from the embedding.
"""

from __future__ import annotations

import torch

from services.learner.lora import adapter_state, is_lora
from shared.weight_channel import Buffer, parse_blob, safetensors_size, write_safetensors

TIED_HEAD = "lm_head.weight"


def publication_state(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The tensors a version is made of, floating ones in `dtype` (None: as the model holds them; a
    mixed-precision learner publishes its float32 masters rounded to the checkpoint's dtype, what the
    engines run). With tied embeddings lm_head.weight is the same tensor as embed_tokens.weight: sending
    it twice would double the bytes, so it is left out and re-tied by the receiver's model. A LoRA model
    publishes its adapter only (services/learner/lora.py)."""
    if is_lora(model):
        state = adapter_state(model)
    else:
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        state = {
            name: tensor.detach().contiguous()
            for name, tensor in model.state_dict().items()
            if not (tied and name == TIED_HEAD)
        }
    if dtype is None:
        return state
    return {name: tensor.to(dtype) if tensor.is_floating_point() else tensor for name, tensor in state.items()}


def serialize_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> bytes:
    """safetensors bytes of the model's state dict (the tied head left out, see publication_state)."""
    tensors = publication_state(model, dtype)
    buffer = bytearray(safetensors_size(tensors))
    write_safetensors(tensors, memoryview(buffer))
    return bytes(buffer)


def load_weights_blob(model: torch.nn.Module, blob: Buffer) -> None:
    """Load `serialize_weights` bytes (any buffer) into a model of the same architecture (in place)."""
    tensors = parse_blob(blob)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if unexpected or [name for name in missing if not (tied and name == TIED_HEAD)]:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
