"""Keyed sampling: how a token was chosen becomes checkable (docs/trust.md#sampling-provenance).

A worker samples token t at completion position i of sample j of a task by inverse-CDF sampling with a
keyed uniform:

    u = keyed_uniform(seed_j, i)        in (0, 1), a pure function of (seed, position): a counter hash
    t = the token whose interval [CDF(t - 1), CDF(t)) contains u,   CDF over token ids of softmax(logits / T)

Inverse-CDF sampling draws exactly from softmax(logits / T), so the sampling distribution and the
behaviour log-probs are those of ordinary sampling. The seed is not the worker's choice: it is derived from
the task id the reward service drew (`sample_seeds`), and sample j uses seed + j (vLLM's rule for the
children of an n > 1 request). Anyone holding the weights of the claimed version recomputes every
position's interval (`choice_gaps`): an honest worker's u falls in its token's interval, up to the numerics
of its engine near an interval's edge; replayed tokens, tokens from other weights, and samples
cherry-picked with other seeds do not.

One uniform per position (not Gumbel noise per vocabulary entry, which costs a hash per token id: 0.17 s
per round at 64 x 49,152 on 2 cores): the sampler's extra cost is a cumulative sum and a search.
The hash is integer arithmetic on int64 tensors whose values stay below 2**49 (no overflow), then one
float32 transform, so CPU and GPU, torch and vLLM compute the same u.
"""

from __future__ import annotations

import hashlib

import torch

MASK32 = 0xFFFFFFFF
# Seeds are below 2**31 - SEED_HEADROOM, so seed + j stays a positive int32 for every sample of a group.
SEED_HEADROOM = 1 << 16
MAX_SEED = (1 << 31) - SEED_HEADROOM
_ROUND_KEY = 0x9E3779B9  # decorrelates the second round from the first


def task_seed(task_id: str) -> int:
    """The base seed of a task: a hash of the task id the reward service drew (uuid4). The work API accepts
    a group only for a task id leased to its worker, so the worker cannot pick it."""
    digest = hashlib.sha256(task_id.encode()).digest()
    return 1 + int.from_bytes(digest[:4], "little") % (MAX_SEED - 1)


def sample_seeds(task_id: str, num_samples: int) -> list[int]:
    """The seed of each sample of a task's group: task_seed + j."""
    base = task_seed(task_id)
    return [base + j for j in range(num_samples)]


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
