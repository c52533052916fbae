"""Sampling provenance: was each token of a group chosen the way keyed sampling says (docs/trust.md#sampling-provenance)?

A spot audit recomputes, with the weights of the version a group claims, the distribution at every
completion position; with the seed that the task id fixes (shared/keyed_sampling.py) each position's keyed
uniform u must fall in the sampled token's CDF interval. `audit_rows` does this in the audit's one forward,
which also yields the log-probs of the exact comparison (audit.py), so provenance costs the audit only the
(n, V) log-softmax and a cumulative sum per completion token on top of what it did already.

An honest engine's u lies in its token's interval, or within the two sides' CDF difference of its edge
(bf16 engines against a float32 audit). A token is a *violation* when its gap exceeds
`provenance_tolerance` (probability mass); a sample fails when more than `MAX_VIOLATION_FRACTION`
of its tokens, and at least MIN_VIOLATIONS of them, are violations; a group fails when
any of its samples does (a worker substituting one sample of eight is caught by that sample). Replayed tokens, tokens
sampled with other weights (far enough from the claimed ones to move a CDF edge past the tolerance) and
samples cherry-picked with other seeds leave their intervals at about the rate 1 - p(token) per position.

Multi-turn episodes are not keyed (their turns restart the position count): only single-turn groups are checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from engines.keyed_tensors import choice_gaps
from services.learner.grpo import check_plain_lm_head
from shared.config import TrustConfig

CHUNK_TOKENS = 512  # completion positions whose (n, V) float32 logits exist at once
MAX_VIOLATION_FRACTION = 0.1  # a sample fails when more than this share of its tokens are violations ...
MIN_VIOLATIONS = 3  # ... and at least this many (a near-tie or two in a short sample is not enough)


@dataclass(frozen=True)
class ProvenanceCheck:
    """One group's keyed-sampling check."""

    num_tokens: int
    num_violations: int  # tokens whose gap exceeded the tolerance
    max_gap: float  # probability mass, the largest over the group's tokens
    num_samples_failed: int
    failed: bool  # some sample failed


def audit_rows(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperatures: torch.Tensor,
    completion_mask: torch.Tensor,
    row_seeds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One no-grad forward of (b, T) right-padded rows -> ((b, T - 1) float32 log-probs of each target token,
    0 off the completion; (b, T - 1) float64 keyed-sampling gaps, 0 off the completion and on rows whose
    seed is negative: not keyed). row_seeds: (b,) the seed of each row (shared/keyed_sampling.sample_seeds)."""
    check_plain_lm_head(model)
    head = model.get_output_embeddings()
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    targets_mask = completion_mask.bool()  # (b, T - 1)
    selected = hidden[:, :-1][targets_mask]  # (n, H): the positions that predict a completion token
    targets = input_ids[:, 1:][targets_mask]  # (n,)
    row_index = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None].expand_as(targets_mask)[targets_mask]
    # position within the completion: how many completion targets precede it in its row
    positions = (targets_mask.cumsum(dim=1) - 1)[targets_mask]  # (n,)
    seeds = row_seeds.to(input_ids.device)[row_index]  # (n,)
    chosen = torch.empty(targets.shape[0], dtype=torch.float32, device=input_ids.device)
    gaps = torch.zeros(targets.shape[0], dtype=torch.float64, device=input_ids.device)
    for start in range(0, targets.shape[0], CHUNK_TOKENS):
        span = slice(start, start + CHUNK_TOKENS)
        logits = head(selected[span]).float() / temperatures.to(input_ids.device)[row_index[span], None]
        logprobs = torch.log_softmax(logits, dim=-1)  # (n, V)
        chosen[span] = logprobs.gather(-1, targets[span, None]).squeeze(-1)
        keyed = seeds[span] >= 0
        if bool(keyed.any()):
            gaps[span][keyed] = choice_gaps(
                logprobs[keyed], targets[span][keyed], seeds[span][keyed], positions[span][keyed]
            )
        del logits, logprobs
    logprob_rows = torch.zeros(targets_mask.shape, dtype=torch.float32, device=input_ids.device)
    gap_rows = torch.zeros(targets_mask.shape, dtype=torch.float64, device=input_ids.device)
    logprob_rows[targets_mask] = chosen
    gap_rows[targets_mask] = gaps
    return logprob_rows, gap_rows


def group_provenance(gaps: torch.Tensor, completion_mask: torch.Tensor, config: TrustConfig) -> ProvenanceCheck:
    """One group's verdict from its rows' (g, T - 1) gaps (one row per sample)."""
    mask = completion_mask.bool()
    violations = (gaps > config.provenance_tolerance) & mask  # (g, T - 1)
    tokens_per_sample = mask.sum(dim=1)  # (g,)
    violations_per_sample = violations.sum(dim=1)  # (g,)
    samples_failed = (violations_per_sample >= MIN_VIOLATIONS) & (
        violations_per_sample > MAX_VIOLATION_FRACTION * tokens_per_sample
    )
    num_tokens = int(tokens_per_sample.sum())
    return ProvenanceCheck(
        num_tokens=num_tokens,
        num_violations=int(violations_per_sample.sum()),
        max_gap=float(gaps[mask].max()) if num_tokens else 0.0,
        num_samples_failed=int(samples_failed.sum()),
        failed=bool(samples_failed.any()),
    )
