"""The policy, its optimizer, and one GRPO training step.

logprobs  = log pi_theta(completion tokens)            # one forward, teacher forcing
loss      = decoupled clipped surrogate (grpo.py)      # pi_prox = pi_theta at the step's start
backward, clip the gradient norm, AdamW step
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from services.learner.batch import TrainBatch
from services.learner.grpo import LossStats, policy_loss, token_logprobs
from shared.config import GRPOConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_policy(model_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The HF causal LM and tokenizer in `model_dir`, float32 on CPU, in train mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    return model, tokenizer


def make_optimizer(model: torch.nn.Module, grpo: GRPOConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=grpo.learning_rate, weight_decay=grpo.weight_decay)


@dataclass(frozen=True)
class StepResult:
    loss: LossStats
    grad_norm: float  # before clipping
    train_s: float  # forward + backward + optimizer step


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, grpo: GRPOConfig
) -> StepResult:
    """One optimizer step on `batch`: the learner's version advances by one after it."""
    started_s = time.perf_counter()
    model.train()

    # Log-probs of every completion token under the current weights, with gradient.
    logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures)  # (B, T-1)

    # One update per batch: the proximal policy is the current one, so its log-probs are these,
    # detached. The importance weight pi_prox / mu then corrects exactly for the batch's staleness.
    loss, stats = policy_loss(
        logprobs,
        proximal_logprobs=logprobs.detach(),
        behaviour_logprobs=batch.behaviour_logprobs,
        advantages=batch.advantages,
        completion_mask=batch.completion_mask,
        clip_eps=grpo.clip_eps,
        max_importance_weight=grpo.max_importance_weight,
    )

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # Clipping keeps one unlucky batch (a few huge-advantage tokens) from undoing earlier progress.
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.max_grad_norm)
    optimizer.step()
    return StepResult(stats, float(grad_norm), time.perf_counter() - started_s)
