"""GRPO, the math only: group advantages, token log-probs under the model, and the policy loss.

Pure torch, no I/O. Shapes: B sequences (one per sample), T tokens per right-padded sequence.

The loss is decoupled PPO (Hilton et al. 2021, as AReaL and verl use it for stale data), token-level.
Three policies meet in it:
- the behaviour policy mu: the version v the worker sampled with (its log-probs come in the message);
- the proximal policy pi_prox: the learner's current weights at the start of the step (version t);
- the new policy pi_theta: the weights being optimised.
Per completion token:

    w     = min(pi_prox / mu, max_importance_weight)       # truncated importance weight, no gradient
    r     = pi_theta / pi_prox                             # PPO ratio, carries the gradient
    loss  = -w * min(r * A, clip(r, 1 - eps, 1 + eps) * A)

and the batch loss is the mean over every completion token of the batch.

Why not the coupled form (r = pi_theta / mu, clipped)? With stale data that puts the trust region
around an old policy: a token whose probability already moved more than eps since version v (in
the direction its advantage favours) gets no gradient at all, so stale samples are largely wasted. Decoupling keeps the trust region around
the current policy and moves the off-policy correction into w. w is truncated (clamped, as in
IMPALA's V-trace and verl's TIS) because pi_prox / mu is unbounded for tokens the policy now strongly
prefers; the clamp trades a small bias for bounded variance. When v == t, w == 1 (up to numerical
differences between the worker's engine and ours) and this is plain on-policy GRPO.

With one optimizer update per batch (`[grpo] num_minibatches = 1, ppo_epochs = 1`), pi_prox == pi_theta
when the loss is evaluated: r is 1 in value and the PPO clip never binds (clip_fraction is 0); the
gradient is -w * A * grad(log pi_theta). With several minibatch updates per batch (trainer.py) pi_prox
stays the weights at the step's start while pi_theta moves after the first update, so r drifts from 1
and the clip bounds how far the later updates push any token: the trust region PPO is named for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional name)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ADVANTAGE_EPS = 1e-4  # docs/design.md#advantage-epsilon-1e-4; keeps (r - mean) / std finite for tiny std


def group_advantages(rewards: torch.Tensor, normalize_by_std: bool) -> torch.Tensor:
    """Advantages of one GRPO group: reward minus the group mean, optionally over the group std.

    rewards: (G,) one per sample of the same prompt. The group mean is the baseline (no value
    network): a sample is good when it beats its siblings. Dividing by the std makes every prompt
    weigh the same whatever its reward spread. We use the population std so a group of one (or of
    equal rewards) gives zeros instead of NaN: such a group carries no signal.
    """
    centered = rewards - rewards.mean()
    if not normalize_by_std:
        return centered
    return centered / (rewards.std(correction=0) + ADVANTAGE_EPS)


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperatures: torch.Tensor,
    chunk_tokens: int = 0,
) -> torch.Tensor:
    """log pi(token_j | tokens_<j) for every position j >= 1, by teacher forcing.

    input_ids, attention_mask: (B, T), right-padded prompt + completion.
    temperatures: (B,) the sampling temperature of each row: the worker sampled from
    softmax(logits / temperature), so that is the distribution whose log-probs we compare against.
    chunk_tokens: positions whose logits exist at once (0: all B * (T - 1) of them).
    Returns (B, T - 1) float32: entry j - 1 is the log-prob of input_ids[:, j]. Callers mask out prompt
    and padding positions.

    Only the chosen token's log-prob is needed, so the (B, T, V) logits are never materialised: the
    decoder body runs once to hidden states, then `ChunkedChosenLogprobs` applies the LM head per
    chunk of positions and reduces each chunk's (n, V) float32 logits to n numbers. At Qwen's
    151,936-token vocabulary a float32 log_softmax over a 512 x 300 batch is ~93 GB (and autograd keeps
    several such tensors); a 1024-position chunk is ~0.6 GB. The result equals `full_token_logprobs`
    in value and gradient (tests/unit/test_learner_step_layout.py).
    """
    check_plain_lm_head(model)
    head = cast(torch.nn.Linear, model.get_output_embeddings())  # H -> V, tied to the embedding or not
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    # (B, T, H) hidden states after the final norm; no KV cache: nothing is generated
    num_rows, num_targets = input_ids.shape[0], input_ids.shape[1] - 1
    # Position j - 1 predicts token j; flatten (B, T - 1) so chunks cut across rows freely.
    hidden = hidden[:, :-1].reshape(num_rows * num_targets, -1)  # (N, H), N = B * (T - 1)
    targets = input_ids[:, 1:].reshape(-1)  # (N,)
    row_temperatures = temperatures[:, None].expand(num_rows, num_targets).reshape(-1).float()  # (N,)
    chunk = chunk_tokens if chunk_tokens > 0 else max(hidden.shape[0], 1)
    logprobs = ChunkedChosenLogprobs.apply(hidden, head.weight, targets, row_temperatures, chunk)  # (N,)
    return cast(torch.Tensor, logprobs).view(num_rows, num_targets)


class ChunkedChosenLogprobs(torch.autograd.Function):
    """logprob_i = z_i[target_i] - logsumexp(z_i),  z_i = (W h_i) / temperature_i,  chunk by chunk.

    A hand-written backward instead of autograd: autograd would keep every chunk's logits (and the
    softmax) for the backward pass, which is the (N, V) tensor again. Here the backward recomputes one
    chunk's logits at a time and turns them into their gradient in place:

        d logprob_i / d z_i = onehot(target_i) - softmax(z_i)
        d z_i / d h_i = W / temperature_i,   d z_i / d W = h_i / temperature_i

    so the peak is one (chunk, V) float32 tensor (every step on it is in place). The matmuls run in the
    compute dtype (the model's, or autocast's under mixed precision); logits, logsumexp and softmax are
    float32 whatever it is (a bf16 logsumexp over 150k entries loses the small probabilities); the
    gradients are cast back to the dtype of h and W, with W's accumulated over the chunks in float32.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,  # (N, H)
        weight: torch.Tensor,  # (V, H) the LM head
        targets: torch.Tensor,  # (N,) long
        temperatures: torch.Tensor,  # (N,) float32
        chunk: int,
    ) -> torch.Tensor:
        # Under autocast (mixed precision) the LM head's matmuls run in the autocast dtype, forward and
        # backward alike: the backward may run where autocast is off (CUDA's autograd thread), so the
        # dtype is decided here, once, and kept.
        device_type = hidden.device.type
        autocast = torch.is_autocast_enabled(device_type)
        ctx.compute_dtype = torch.get_autocast_dtype(device_type) if autocast else weight.dtype
        compute_weight = weight.to(ctx.compute_dtype)  # (V, H); the same tensor when no cast is needed
        logprobs = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)  # (N,)
        for span in _spans(hidden.shape[0], chunk):
            logits = _scaled_logits(hidden[span].to(ctx.compute_dtype), compute_weight, temperatures[span])  # (n, V)
            chosen = logits.gather(-1, targets[span, None]).squeeze(-1)  # (n,)
            row_max, exp_sum = _exp_in_place(logits)
            logprobs[span] = chosen - row_max - exp_sum.log()  # chosen - logsumexp
            del logits  # before the next chunk's exist: one (n, V) at a time
        ctx.save_for_backward(hidden, weight, targets, temperatures)
        ctx.chunk = chunk
        return logprobs

    @staticmethod
    def backward(
        ctx: Any, grad_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden, weight, targets, temperatures = ctx.saved_tensors
        compute_weight = weight.to(ctx.compute_dtype)  # (V, H)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for span in _spans(hidden.shape[0], ctx.chunk):
            compute_hidden = hidden[span].to(ctx.compute_dtype)  # (n, H)
            logits = _scaled_logits(compute_hidden, compute_weight, temperatures[span])  # (n, V)
            _, exp_sum = _exp_in_place(logits)
            grad_logits = logits.div_(exp_sum[:, None])  # softmax, in place
            grad_logits.neg_().scatter_add_(-1, targets[span, None], torch.ones_like(grad_logits[:, :1]))
            # onehot - softmax, times the incoming gradient, times d z / d (W h) = 1 / temperature
            grad_logits.mul_((grad_logprobs[span].float() / temperatures[span])[:, None])
            if grad_hidden is not None:
                grad_hidden[span] = grad_logits.to(ctx.compute_dtype) @ compute_weight
            if grad_weight is None:
                pass
            elif ctx.compute_dtype == torch.float32:
                grad_weight.addmm_(grad_logits.T, hidden[span].float())
            else:  # the (V, H) product in the compute dtype, accumulated over the chunks in float32
                grad_weight += (grad_logits.T.to(ctx.compute_dtype) @ compute_hidden).float()
            del logits, grad_logits  # before the next chunk's exist
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None


def _spans(num_positions: int, chunk: int) -> list[slice]:
    return [slice(start, min(start + chunk, num_positions)) for start in range(0, num_positions, chunk)]


def _exp_in_place(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Overwrite (n, V) logits z with exp(z - max z) and return (max z, sum exp(z - max z)), both (n,).
    logsumexp = max + log(sum); softmax = logits / sum. In place: torch.logsumexp would allocate a
    second (n, V) tensor, and at a 150k vocabulary that doubles the peak."""
    row_max = logits.max(dim=-1, keepdim=True).values
    exp_sum = logits.sub_(row_max).exp_().sum(dim=-1)
    return row_max.squeeze(-1), exp_sum


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """(n, V) float32 logits / temperature from (n, H) hidden states, divided in place (one copy)."""
    return (hidden @ weight.T).float().div_(temperatures[:, None])


def check_plain_lm_head(model: PreTrainedModel) -> None:
    # token_logprobs rebuilds the logits as lm_head(hidden); models that post-process them would be wrong.
    if getattr(model.get_output_embeddings(), "bias", None) is not None:
        raise ValueError("token_logprobs does not support an LM head with a bias")
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None):
            raise ValueError(f"token_logprobs does not support {name} (set in the model config)")


def full_token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperatures: torch.Tensor
) -> torch.Tensor:
    """The reference `token_logprobs`: one forward to (B, T, V) logits and a float32 log_softmax over all
    of them. Exact and simple, and its memory grows with B * T * V: kept for tests and the benchmark."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    logits = logits[:, :-1].float() / temperatures[:, None, None]  # position j - 1 predicts token j
    logprobs = F.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


@dataclass(frozen=True)
class LossStats:
    """Diagnostics of one loss evaluation, all means over the batch's completion tokens."""

    loss: float
    ratio_mean: float  # pi_theta / mu before truncation: how far the batch is off-policy
    clip_fraction: float  # tokens where the PPO clip bound the objective (0 in a step's first update)
    truncated_fraction: float  # tokens whose importance weight was capped at max_importance_weight
    approx_kl: float  # KL(mu || pi_theta), k3 estimator on mu's samples: E[ratio - 1 - log ratio]
    num_tokens: int


def policy_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_eps: float,
    max_importance_weight: float,
    loss_num_tokens: int | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The decoupled, token-level clipped surrogate (module docstring); returns (loss, stats).

    logprobs: (B, L) under pi_theta, with gradient. proximal_logprobs: (B, L) under pi_prox, detached.
    behaviour_logprobs: (B, L) from the worker. advantages: (B, 1) or (B, L). completion_mask: (B, L)
    bool, True on completion tokens (prompt and padding positions are ignored).
    loss_num_tokens: what the token sum is divided by; None: this batch's completion tokens. A
    micro-batch passes the whole step's count, so the micro-batch losses (and gradients) add up to
    the step's token mean exactly; a per-micro-batch mean would over-weight short micro-batches.
    """
    mask = completion_mask.float()
    num_tokens = int(mask.sum().item())
    denominator = num_tokens if loss_num_tokens is None else loss_num_tokens
    proximal_logprobs = proximal_logprobs.detach()

    # Off-policy correction: how much more likely the current policy finds the worker's token than
    # the worker did. A constant in the objective (no gradient), capped to bound the variance.
    # Positions outside the completion are set to weight 1 so nothing there can be inf or NaN
    # (0 * inf in the backward pass would poison every gradient).
    importance_weight = torch.exp(torch.where(completion_mask, proximal_logprobs - behaviour_logprobs, 0.0))
    truncated_weight = importance_weight.clamp(max=max_importance_weight)

    # PPO trust region around the current policy.
    ratio = torch.exp(logprobs - proximal_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    surrogate = torch.minimum(unclipped, clipped)

    # Token-level mean (DAPO): every completion token counts once, so long completions are not
    # down-weighted relative to short ones as a per-sample mean would do.
    per_token_loss = -truncated_weight * surrogate
    loss = (per_token_loss * mask).sum() / max(denominator, 1)

    with torch.no_grad():
        log_ratio = torch.where(completion_mask, logprobs.detach() - behaviour_logprobs, 0.0)  # log(pi_theta / mu)
        stats = LossStats(
            loss=float(loss.item()),
            ratio_mean=_masked_mean(torch.exp(log_ratio), mask),
            clip_fraction=_masked_mean((clipped < unclipped).float(), mask),
            truncated_fraction=_masked_mean((importance_weight > max_importance_weight).float(), mask),
            approx_kl=_masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask),
            num_tokens=num_tokens,
        )
    return loss, stats


@dataclass(frozen=True)
class ImportanceStats:
    """The off-policy correction of one batch: w = pi_prox / mu over its completion tokens, before the
    truncation (the behaviour policy mu against the learner's weights at the step's start)."""

    weight_mean: float
    weight_max: float
    truncated_fraction: float  # tokens with w > max_importance_weight (their weight is capped in the loss)
    ess_fraction: float  # (sum w)^2 / (n * sum w^2) in (0, 1]: 1 when every w is equal, about k / n when k dominate
    num_tokens: int


def importance_stats(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    completion_mask: torch.Tensor,
    max_importance_weight: float,
) -> ImportanceStats:
    """Importance-weight diagnostics over the completion tokens; inputs (B, L) as in `policy_loss`.

    The effective sample size (Kish) says how many of the n tokens the weighted estimate is worth: a
    fresh batch has w = 1 everywhere and ESS = n; a stale one whose weights spread (a few tokens the
    policy now prefers by far) is worth fewer. It is computed from log w with logsumexp in float64, so a
    token the worker found very unlikely cannot overflow it: ESS / n = exp(2 lse(log w) - log n - lse(2 log w)).
    """
    log_weights = (proximal_logprobs.detach() - behaviour_logprobs)[completion_mask].double()  # (n,) log w
    num_tokens = int(log_weights.numel())
    if num_tokens == 0:  # nothing sampled: nothing is off-policy
        return ImportanceStats(1.0, 1.0, 0.0, 1.0, 0)
    log_ess = 2 * torch.logsumexp(log_weights, 0) - math.log(num_tokens) - torch.logsumexp(2 * log_weights, 0)
    weights = log_weights.exp()
    return ImportanceStats(
        weight_mean=float(weights.mean()),
        weight_max=float(weights.max()),
        truncated_fraction=float((weights > max_importance_weight).double().mean()),
        ess_fraction=min(float(log_ess.exp()), 1.0),  # <= 1 by Cauchy-Schwarz; min() drops rounding above it
        num_tokens=num_tokens,
    )


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum().item() / max(mask.sum().item(), 1.0))
