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

The learner takes one optimizer step per batch, so pi_prox == pi_theta when the loss is evaluated:
r is 1 in value and the PPO clip never binds (clip_fraction is 0); the gradient is
-w * A * grad(log pi_theta). The clip is kept so the same function stays correct if a step is ever
split into several optimizer updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional name)

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
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperatures: torch.Tensor
) -> torch.Tensor:
    """log pi(token_j | tokens_<j) for every position j >= 1, by teacher forcing.

    input_ids, attention_mask: (B, T), right-padded prompt + completion.
    temperatures: (B,) the sampling temperature of each row: the worker sampled from
    softmax(logits / temperature), so that is the distribution whose log-probs we compare against.
    Returns (B, T - 1): entry j - 1 is the log-prob of input_ids[:, j]. Callers mask out prompt and
    padding positions.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    logits = logits[:, :-1].float() / temperatures[:, None, None]  # position j - 1 predicts token j
    # Full log_softmax is fine for small vocabularies; a 150k-vocab model would want a chunked
    # logsumexp here instead of materialising (B, T, V) log-probs.
    logprobs = F.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


@dataclass(frozen=True)
class LossStats:
    """Diagnostics of one loss evaluation, all means over the batch's completion tokens."""

    loss: float
    ratio_mean: float  # pi_theta / mu before truncation: how far the batch is off-policy
    clip_fraction: float  # tokens where the PPO clip bound the objective (0 with one update per batch)
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
) -> tuple[torch.Tensor, LossStats]:
    """The decoupled, token-level clipped surrogate (module docstring); returns (loss, stats).

    logprobs: (B, L) under pi_theta, with gradient. proximal_logprobs: (B, L) under pi_prox, detached.
    behaviour_logprobs: (B, L) from the worker. advantages: (B, 1) or (B, L). completion_mask: (B, L)
    bool, True on completion tokens (prompt and padding positions are ignored).
    """
    mask = completion_mask.float()
    num_tokens = int(mask.sum().item())
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
    loss = (per_token_loss * mask).sum() / max(num_tokens, 1)

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


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum().item() / max(mask.sum().item(), 1.0))
