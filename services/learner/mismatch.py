"""Engine mismatch: how far a worker's behaviour log-probs are from the learner's recomputation when
both used the same weights.

A lag-0 group (sampled with version t, trained at step t + 1) has pi_prox == mu in exact arithmetic,
so any gap is the two engines disagreeing (kernels, dtypes, a sampler applying top-p or a different
temperature, a worker holding wrong weights). The importance weight pi_prox / mu reads that gap as
staleness; measuring it per worker on lag-0 tokens separates it from real staleness. Rollouts carry no
engine name, so the split is by worker id only.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from services.learner.batch import AdmittedGroup, TrainBatch
from shared.messages import WorkerMismatch


def engine_mismatch(
    groups: list[AdmittedGroup], tensors: TrainBatch, logprobs: torch.Tensor
) -> dict[str, WorkerMismatch]:
    """Per worker, over the completion tokens of its lag-0 groups: mean |log mu - log pi| and KL(mu || pi).

    groups: the step's groups in `tensorize` order (each one's samples are consecutive rows).
    logprobs: (B, T - 1) the learner's recomputed log-probs (pi_prox), aligned with `tensors`.
    """
    rows_by_worker: dict[str, list[int]] = defaultdict(list)
    first_row = 0
    for admitted in groups:
        rollout = admitted.group.rollout
        if admitted.staleness == 0:
            rows_by_worker[rollout.worker_id].extend(range(first_row, first_row + rollout.num_samples))
        first_row += rollout.num_samples

    mismatch: dict[str, WorkerMismatch] = {}
    for worker_id, rows in sorted(rows_by_worker.items()):
        index = torch.tensor(rows)
        mask = tensors.completion_mask[index]  # (b, T - 1)
        log_ratio = (logprobs[index] - tensors.behaviour_logprobs[index])[mask]  # (n,) log(pi / mu)
        if log_ratio.numel() == 0:  # only empty completions
            continue
        mismatch[worker_id] = WorkerMismatch(
            num_tokens=int(log_ratio.numel()),
            logprob_abs_diff_mean=float(log_ratio.abs().mean()),
            kl_k3=float((torch.exp(log_ratio) - 1.0 - log_ratio).mean()),
        )
    return mismatch
