"""The policy, its optimizer, and one GRPO training step.

for each micro-batch of rows:                           # the whole batch unless micro_batch_size is set
    logprobs  = log pi_theta(completion tokens)         # teacher forcing, dropout off, chunked LM head
    loss      = decoupled clipped surrogate (grpo.py)   # pi_prox = pi_theta at the step's start,
                                                        # token sum / the step's completion tokens
    backward                                            # gradients add up to the whole batch's
clip the gradient norm, AdamW step
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from services.learner.batch import TrainBatch
from services.learner.grpo import LossStats, policy_loss, token_logprobs
from shared.config import GRPOConfig, LearnerConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device_dtype(learner: LearnerConfig) -> tuple[torch.device, torch.dtype]:
    """The run file's device and dtype with "auto" decided: cuda and bfloat16 when a GPU is there,
    else cpu and float32 (bf16 matmuls on CPU are slow and gain nothing at the demo's size)."""
    if learner.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("learner.device is cuda but torch sees no CUDA device")
    device_name = learner.device if learner.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if learner.dtype != "auto":
        return torch.device(device_name), DTYPES[learner.dtype]
    return torch.device(device_name), torch.bfloat16 if device_name == "cuda" else torch.float32


def load_policy(
    model_dir: Path, learner: LearnerConfig | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The HF causal LM and tokenizer in `model_dir`, on the run file's device and dtype (the defaults:
    float32 on CPU when no GPU is there), with gradient checkpointing when asked."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    learner = learner or LearnerConfig()
    device, dtype = resolve_device_dtype(learner)
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    torch.nn.Module.to(model, device)  # (device_map= would need accelerate)
    if learner.gradient_checkpointing:
        # transformers 5 renamed gradient_checkpointing_enable (a deprecated alias now) to this.
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    log.info("policy on %s in %s (gradient checkpointing %s)", device, dtype, learner.gradient_checkpointing)
    return model, tokenizer


def make_optimizer(model: torch.nn.Module, grpo: GRPOConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=grpo.learning_rate, weight_decay=grpo.weight_decay)


@dataclass(frozen=True)
class StepResult:
    loss: LossStats
    grad_norm: float  # before clipping
    train_s: float  # forward + backward + optimizer step
    logprobs: torch.Tensor  # (B, T - 1) float32 on CPU, detached: pi_prox, the recomputed log-probs


def train_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    grpo: GRPOConfig,
    learner: LearnerConfig | None = None,
) -> StepResult:
    """One optimizer step on `batch`: the learner's version advances by one after it."""
    learner = learner or LearnerConfig()
    started_s = time.perf_counter()
    disable_dropout(model)
    batch = batch.to(next(model.parameters()).device)
    step_num_tokens = batch.num_tokens
    logprobs = torch.zeros_like(batch.behaviour_logprobs)  # (B, T - 1) detached, for the stats

    corrected = grpo.off_policy_correction == "truncated_is"
    optimizer.zero_grad(set_to_none=True)
    for rows in micro_batches(batch.num_samples, learner.micro_batch_size):
        # Log-probs of every completion token under the current weights, with gradient.
        micro_logprobs = token_logprobs(
            model,
            batch.input_ids[rows],
            batch.attention_mask[rows],
            batch.temperatures[rows],
            chunk_tokens=learner.logprob_chunk_tokens,
        )  # (b, T - 1)
        # One update per batch: the proximal policy is the current one, so its log-probs are these,
        # detached. The importance weight pi_prox / mu then corrects exactly for the batch's staleness.
        # correction "none" (the ablation's control): behaviour := proximal, so every weight is 1
        behaviour = batch.behaviour_logprobs[rows] if corrected else micro_logprobs.detach()
        micro_loss, _ = policy_loss(
            micro_logprobs,
            proximal_logprobs=micro_logprobs.detach(),
            behaviour_logprobs=behaviour,
            advantages=batch.advantages[rows],
            completion_mask=batch.completion_mask[rows],
            clip_eps=grpo.clip_eps,
            max_importance_weight=grpo.max_importance_weight,
            loss_num_tokens=step_num_tokens,  # so the micro-batch gradients sum to the step's token mean
        )
        micro_loss.backward()
        logprobs[rows] = micro_logprobs.detach()

    # Clipping keeps one unlucky batch (a few huge-advantage tokens) from undoing earlier progress.
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.max_grad_norm)
    optimizer.step()
    with torch.no_grad():  # the step's diagnostics, over the whole batch at once (against the real mu)
        _, stats = policy_loss(
            logprobs,
            proximal_logprobs=logprobs,
            behaviour_logprobs=batch.behaviour_logprobs,
            advantages=batch.advantages,
            completion_mask=batch.completion_mask,
            clip_eps=grpo.clip_eps,
            max_importance_weight=grpo.max_importance_weight,
        )
    return StepResult(stats, float(grad_norm), time.perf_counter() - started_s, logprobs.cpu())


def micro_batches(num_rows: int, micro_batch_size: int) -> list[slice]:
    """Row ranges of at most `micro_batch_size` rows covering [0, num_rows); 0: one range, all rows."""
    size = micro_batch_size if micro_batch_size > 0 else max(num_rows, 1)
    return [slice(start, min(start + size, num_rows)) for start in range(0, num_rows, size)]


def disable_dropout(model: torch.nn.Module) -> None:
    """Train mode for the RL forward, minus dropout: eval() everywhere (gradients still flow).

    The learner's log-probs are pi_prox in the importance weight pi_prox / mu: with dropout on they
    carry noise of their own (0.08-0.31 nats on GPT-2 configs) that the weight reads as staleness, and
    the worker sampled without dropout anyway. HF gradient checkpointing runs only in a layer whose
    `training` flag is set, so with checkpointing on the decoder layers alone keep the flag: they
    hold no dropout of their own, their children (attention, MLP, dropout modules) stay in eval.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.eval()
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            module.training = True
