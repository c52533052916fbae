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

This module is the torch-free half, the seeds every process agrees on (the worker derives them, the learner's
audits recompute them); the tensor half (keyed_uniform, keyed_choice, choice_gaps) is engines/keyed_tensors.py,
beside the engines that sample with it.
"""

from __future__ import annotations

import hashlib

MASK32 = 0xFFFFFFFF
# Seeds are below 2**31 - SEED_HEADROOM, so seed + j stays a positive int32 for every sample of a group.
SEED_HEADROOM = 1 << 16
MAX_SEED = (1 << 31) - SEED_HEADROOM


def task_seed(task_id: str) -> int:
    """The base seed of a task: a hash of the task id the reward service drew (uuid4). The work API accepts
    a group only for a task id leased to its worker, so the worker cannot pick it."""
    digest = hashlib.sha256(task_id.encode()).digest()
    return 1 + int.from_bytes(digest[:4], "little") % (MAX_SEED - 1)


def sample_seeds(task_id: str, num_samples: int) -> list[int]:
    """The seed of each sample of a task's group: task_seed + j."""
    base = task_seed(task_id)
    return [base + j for j in range(num_samples)]
