"""How the learner holds and computes the policy: `[learner] precision` (docs/precision.md).

    mixed   float32 master weights and AdamW moments; forward and backward matmuls in bfloat16
            (torch.autocast; a sharded policy: FSDP2's MixedPrecisionPolicy, bf16 parameters for compute
            and float32 gradient reduction, float32 shards)
    fp32    float32 throughout
    bf16    bfloat16 weights and moments, no master copy (only when asked for by name: it loses updates)
    auto    mixed on cuda; on cpu mixed for a bf16/fp16 checkpoint, else fp32 (a float32 checkpoint on a
            CPU is the demo's tiny model, where fp32 is exact and as fast)

Why not pure bf16: bf16 keeps 8 significant bits, so adding an update u to a weight w changes it only
if |u| >= about 2^-9 |w|. AdamW's first updates are about lr per element; at lr 1e-6 only weights with
|w| < ~5e-4 can move, a fraction of a percent of a pretrained model's (measured on SmolLM2-135M: 0.38% of
elements per step against 99.9% with fp32 masters). The bf16 matmuls keep nearly all of the speed.

Published weights are in the checkpoint's dtype (`publish_dtype`): what the workers' engines load.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.config import LearnerConfig
from shared.tokenization import checkpoint_dtype_name

log = logging.getLogger(__name__)

BF16_RELATIVE_HALF_SPACING = 2.0**-9  # |u| below this times |w| rounds away when added to w in bf16
CHECKPOINT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """The resolved `[learner] precision` of one learner process."""

    mode: str  # mixed | fp32 | bf16
    device: torch.device
    param_dtype: torch.dtype  # master weights, gradients and optimizer state
    compute_dtype: torch.dtype  # matmuls of the forward and backward
    publish_dtype: torch.dtype  # the weights a version is published in (the workers' engines load these)

    @property
    def autocasts(self) -> bool:
        return self.compute_dtype != self.param_dtype

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Around every forward (and its backward, which autograd runs with the forward's casts)."""
        if not self.autocasts:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.compute_dtype):
            yield


def checkpoint_dtype(model_dir: Path) -> torch.dtype:
    """The dtype the model folder's config.json says its weights are (float32 when it says none)."""
    return CHECKPOINT_DTYPES.get(checkpoint_dtype_name(model_dir), torch.float32)


def set_config_dtype(model_dir: Path, dtype: torch.dtype) -> None:
    """Make config.json name the dtype the folder's weights were saved in (save_pretrained writes the
    in-memory model's, float32 for a mixed-precision learner's masters)."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config.pop("torch_dtype", None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def resolve_precision(learner: LearnerConfig, model_dir: Path) -> Precision:
    """The run file's device and precision with "auto" decided (see the module docstring)."""
    if learner.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("learner.device is cuda but torch sees no CUDA device")
    device = torch.device(
        learner.device if learner.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    stored = checkpoint_dtype(model_dir)
    mode = learner.precision
    if mode == "auto":
        mode = "mixed" if device.type == "cuda" or stored != torch.float32 else "fp32"
    if mode == "mixed":
        return Precision(mode, device, torch.float32, torch.bfloat16, stored)
    if mode == "bf16":
        return Precision(mode, device, torch.bfloat16, torch.bfloat16, torch.bfloat16)
    return Precision(mode, device, torch.float32, torch.float32, torch.float32 if stored == torch.float32 else stored)


def warn_if_updates_are_lost(precision: Precision, model: torch.nn.Module, learning_rate: float) -> float:
    """Pure bf16: log what fraction of the trainable elements an update of `learning_rate` can move at all
    (|w| < lr / 2^-9) and return it; other precisions: 1.0, nothing logged."""
    if precision.param_dtype != torch.bfloat16:
        return 1.0
    smallest_movable = learning_rate / BF16_RELATIVE_HALF_SPACING  # |w| at or above this cannot take lr
    num_movable = num_total = 0
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                num_movable += int((parameter.abs() < smallest_movable).sum())
                num_total += parameter.numel()
    fraction = num_movable / max(num_total, 1)
    log.warning(
        "[learner] precision = 'bf16': weights and AdamW state in bfloat16 keep 8 significant bits, so an update "
        "is lost unless it is at least 2^-9 of the weight. At lr %.1e (an AdamW update of about lr) only weights "
        "with |w| < %.1e can move: %.2f%% of this model's %d trainable elements. Use precision = 'mixed' "
        "(fp32 masters, bf16 compute) to train a pretrained checkpoint.",
        learning_rate,
        smallest_movable,
        100 * fraction,
        num_total,
    )
    return fraction
