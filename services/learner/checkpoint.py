"""Checkpoints: everything the learner needs to resume at the same version after a crash.

One file, <run_dir>/checkpoints/latest.pt, replaced atomically (write a temporary file, fsync,
os.replace, fsync the directory): a crash at any moment leaves either the old or the new checkpoint,
never a torn one. Stream positions need no saving: the consumer group keeps them, and every group
trained on since this checkpoint is still pending for the learner's consumer (acked only after the
checkpoint covering it is on disk). The checkpoint lists the ids it covers, so a crash between saving
and acking does not train on them twice.

Model and optimizer state are full tensors keyed by parameter name (torch.distributed.checkpoint's
state_dict API, policy.py), whatever the learner's world size: a checkpoint written by 2 ranks resumes on
1 and the other way round. Sharded, rank 0 writes it (the whole model and the optimizer's state gathered
to its CPU: 3x the parameters' bytes with AdamW). The RNG state is rank 0's; a learner step draws no
random numbers (dropout is off, the minibatch shuffle is seeded by the version).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_FORMAT = 2  # 2: optimizer state keyed by parameter name (1: by position)


@dataclass
class Checkpoint:
    policy_version: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]  # get_optimizer_state_dict(full_state_dict=True): keyed by parameter name
    counters: dict[str, Any]  # RunTotals.model_dump(): cumulative metrics, drop counts, eval history
    covered_message_ids: list[str]  # scored entries trained on since the previous checkpoint
    torch_rng_state: torch.Tensor
    python_rng_state: tuple


def checkpoint_path(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest.pt"


def capture(
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    policy_version: int,
    counters: dict[str, Any],
    covered_message_ids: list[str],
) -> Checkpoint:
    """`model_state` and `optimizer_state` from Policy.checkpoint_state()."""
    return Checkpoint(
        policy_version=policy_version,
        model_state=model_state,
        optimizer_state=optimizer_state,
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


def restore_rng(checkpoint: Checkpoint) -> None:
    """Put the RNG state back as it was when `checkpoint` was captured (the weights: Policy.restore)."""
    torch.set_rng_state(checkpoint.torch_rng_state)
    random.setstate(checkpoint.python_rng_state)
