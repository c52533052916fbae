"""The tensor half of keyed sampling (shared/keyed_sampling.py has the rule and the seeds): the keyed uniform of
a (seed, position), the inverse-CDF choice the engines sample with, and the interval check the learner's
provenance check recomputes (docs/trust.md#sampling-provenance).
"""

from __future__ import annotations

import torch

from shared.keyed_sampling import MASK32

_ROUND_KEY = 0x9E3779B9  # decorrelates the second round from the first


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for int64 x in [0, 2**32), with no intermediate above 2**49."""
    low, high = x & 0xFFFF, x >> 16
    return (low * constant + ((high * (constant & 0xFFFF)) << 16)) & MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32: xor-shift, multiply, twice): good avalanche, cheap."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniform(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(N,) int seeds and (N,) completion positions -> (N,) float32 u in (0, 1) (24 bits, never 0 or 1), on
    their device: a two-round hash of (seed, position)."""
    seeds = seeds.to(torch.int64) & MASK32
    positions = positions.to(torch.int64) & MASK32
    bits = _mix32(_mix32(_mix32(seeds) ^ positions) ^ _ROUND_KEY)
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def keyed_choice(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(N, V) probabilities of the sampling distribution (unnormalised is fine: each row is scaled by its
    sum) -> (N,) the tokens keyed inverse-CDF sampling picks."""
    cdf = probs.float().cumsum(dim=-1)  # (N, V)
    target = keyed_uniform(seeds, positions).to(cdf.device) * cdf[:, -1]  # (N,)
    tokens = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1)  # first v with CDF(v) > target
    return tokens.clamp(max=probs.shape[-1] - 1)


def choice_gaps(
    logprobs: torch.Tensor, tokens: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """How far each token is from being keyed sampling's pick under `logprobs` ((N, V), the verifier's
    log-softmax of logits / T): (N,) the probability mass between u and the token's interval
    [CDF(t - 1), CDF(t)), 0 when u is inside it. An honest engine's gap is 0, or about the difference of
    the two sides' CDFs where u fell near an interval's edge."""
    probs = logprobs.double().exp()
    probs = probs / probs.sum(dim=-1, keepdim=True)
    cdf = probs.cumsum(dim=-1)  # (N, V), float64: the verifier's own rounding stays far below any tolerance
    index = tokens.to(torch.int64)[:, None]
    upper = cdf.gather(-1, index).squeeze(-1)  # CDF(t)
    lower = upper - probs.gather(-1, index).squeeze(-1)  # CDF(t - 1)
    u = keyed_uniform(seeds, positions).to(cdf.device).double()
    return (lower - u).clamp(min=0) + (u - upper).clamp(min=0)
