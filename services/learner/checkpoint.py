"""Checkpoints: everything the learner needs to resume at the same version after a crash.

One file, <run_dir>/checkpoints/latest.pt, replaced atomically (write a temporary file, fsync,
os.replace, fsync the directory): a crash at any moment leaves either the old or the new checkpoint,
never a torn one. Stream positions need no saving: the consumer group keeps them, and every group
trained on since this checkpoint is still pending for the learner's consumer (acked only after the
checkpoint covering it is on disk). The checkpoint lists the ids it covers, so a crash between saving
and acking does not train on them twice.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.learner.lora import checkpoint_state, restore_state

CHECKPOINT_FORMAT = 1


@dataclass
class Checkpoint:
    policy_version: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    counters: dict[str, Any]  # RunTotals.model_dump(): cumulative metrics, drop counts, eval history
    covered_message_ids: list[str]  # scored entries trained on since the previous checkpoint
    torch_rng_state: torch.Tensor
    python_rng_state: tuple


def checkpoint_path(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest.pt"


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    policy_version: int,
    counters: dict[str, Any],
    covered_message_ids: list[str],
) -> Checkpoint:
    return Checkpoint(
        policy_version=policy_version,
        model_state=checkpoint_state(model),  # a LoRA run: the adapter only (the base is the model folder)
        optimizer_state=optimizer.state_dict(),
        counters=counters,
        covered_message_ids=list(covered_message_ids),
        torch_rng_state=torch.get_rng_state(),
        python_rng_state=random.getstate(),
    )


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write atomically: readers (and a restarted learner) only ever see a complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(path.suffix + ".tmp")
    payload = {"format": CHECKPOINT_FORMAT, **checkpoint.__dict__}
    with open(tmp_path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_path, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)


def load_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint at `path`, or None when there is none (a fresh run)."""
    if not path.exists():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.pop("format", None) != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a learner checkpoint of format {CHECKPOINT_FORMAT}")
    return Checkpoint(**payload)


def restore(checkpoint: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Put model, optimizer and RNG state back exactly as they were when `checkpoint` was captured."""
    restore_state(model, checkpoint.model_state)
    optimizer.load_state_dict(checkpoint.optimizer_state)
    torch.set_rng_state(checkpoint.torch_rng_state)
    random.setstate(checkpoint.python_rng_state)
