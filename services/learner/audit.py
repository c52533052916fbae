"""Exact comparisons at the claimed version: the learner re-scores a group with the weights of the very
version v the worker says it sampled with (docs/trust.md); a group sampled while new weights landed
(continuous batching) is re-scored token by token with the version each token names.

An honest worker's behaviour log-probs mu then match to engine precision; a worker that sampled with other
weights (older than claimed), invented mu, or sent token ids it did not sample does not. Two sources of pi_v:

- lag 0 (v == t): pi_prox, which the training step computed anyway, is pi_v: free.
- a spot audit, at any lag, for `audit_fraction` of the groups whose version the learner still holds in
  memory (`VersionCache`, the last `audit_keep_versions` versions it published): one no-grad forward of
  the group's rows on a second copy of the model. The choice is random per group, so a worker cannot
  tell which of its groups will be checked. The same forward checks the group's sampling provenance
  (provenance.py): whether each token is the one keyed sampling picks with the task's seed.

Only versions this learner process published are compared, and only groups created after that publication:
after a learner restart, a version number the old process published may name other weights.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch

from services.learner.batch import AdmittedGroup, TrainBatch
from services.learner.provenance import ProvenanceCheck, audit_rows, group_provenance
from services.learner.trust import GroupStatistic, group_abs_diffs
from shared.config import TrustConfig
from shared.keyed_sampling import sample_seeds
from shared.messages import unpack_int32


@dataclass(frozen=True)
class ExactCheck:
    """One group's comparison at its claimed version (diff None: not checked)."""

    exact_diff_nats: float | None  # mean |log mu - log pi_v| over the group's completion tokens
    audit_s: float  # wall seconds a spot audit took (0 for lag 0 and unchecked groups)
    provenance: ProvenanceCheck | None = None  # a spot audit of a keyed (single-turn) group


NOT_CHECKED = ExactCheck(None, 0.0)


class VersionCache:
    """The weights of the last `keep_versions` versions this process published (CPU copies; at the demo's
    124k parameters 0.5 MB each; at Qwen3-0.6B in bf16, 1.2 GB each: set audit_keep_versions accordingly)."""

    def __init__(self, keep_versions: int) -> None:
        self.keep_versions = keep_versions
        self._weights: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self._published_at_s: dict[int, float] = {}

    def remember(self, version: int, model: torch.nn.Module) -> None:
        self._published_at_s[version] = time.time()
        if self.keep_versions == 0:
            return
        self._weights[version] = {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}
        self._weights.move_to_end(version)
        while len(self._weights) > self.keep_versions:
            self._weights.popitem(last=False)

    def published_at_s(self, version: int) -> float | None:
        """Unix time this process published `version` (None: it did not)."""
        return self._published_at_s.get(version)

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        return self._weights.get(version)


def sampled_versions(admitted: AdmittedGroup) -> tuple[int, ...]:
    """The versions that sampled the group's tokens, oldest first (one, unless new weights landed while it was
    in flight: docs/continuous_batching.md)."""
    rollout = admitted.group.rollout
    if not rollout.version_changes:
        return (rollout.policy_version,)
    return tuple(sorted(set(rollout.token_versions().tolist())))


def position_versions(groups: list[AdmittedGroup], width: int) -> torch.Tensor:
    """(b, width) the version that sampled the token at each target position of the groups' rows, in the
    layout of batch.tensorize (target position j - 1 holds token j); the group's policy_version elsewhere."""
    rows = []
    for admitted in groups:
        rollout = admitted.group.rollout
        start = len(rollout.prompt_tokens()) - 1
        lengths = unpack_int32(rollout.completion_lengths).tolist()
        versions = np.split(rollout.token_versions(), np.cumsum(lengths)[:-1])
        for sample_versions in versions:
            row = torch.full((width,), rollout.policy_version, dtype=torch.long)
            row[start : start + len(sample_versions)] = torch.from_numpy(sample_versions.astype(np.int64))
            rows.append(row)
    return torch.stack(rows)


class Auditor:
    """Decides which groups get an exact comparison and computes it."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrustConfig,
        seed: int | None = None,
        compute: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.config = config
        self.compute = compute  # the learner's precision (autocast under mixed): pi_v computed as pi_prox is
        self.cache = VersionCache(config.audit_keep_versions if config.audit_fraction > 0 else 0)
        self.policy = model
        self._audit_model: torch.nn.Module | None = None  # a copy of the policy, built at the first audit
        self._loaded_version: int | None = None
        self._rng = random.Random(seed)  # None: seeded from the OS, so no worker can predict the choice

    def remember(self, version: int, model: torch.nn.Module) -> None:
        """`version` was just published with `model`'s weights."""
        self.cache.remember(version, model)

    def check(
        self, groups: list[AdmittedGroup], statistics: list[GroupStatistic], tensors: TrainBatch
    ) -> list[ExactCheck]:
        """Per group (same order as `statistics`): its exact comparison, or NOT_CHECKED."""
        checks: list[ExactCheck] = [NOT_CHECKED] * len(statistics)
        audits: dict[tuple[int, ...], list[int]] = {}  # the versions that sampled them -> groups to audit
        for index, (admitted, stat) in enumerate(zip(groups, statistics, strict=True)):
            published_at_s = self.cache.published_at_s(stat.policy_version)
            if published_at_s is None or admitted.group.rollout.created_at_s < published_at_s or stat.num_tokens == 0:
                continue
            versions = sampled_versions(admitted)
            if self._rng.random() < self.config.audit_fraction and all(self.cache.weights(v) for v in versions):
                audits.setdefault(versions, []).append(index)
            elif stat.lag == 0:  # its oldest token is the learner's version: every token is
                checks[index] = ExactCheck(stat.abs_diff_nats, 0.0)  # pi_prox is pi_v
        for versions, indices in audits.items():
            audited = [groups[i] for i in indices]
            for index, check in zip(
                indices, self.audit(versions, audited, [statistics[i] for i in indices], tensors), strict=True
            ):
                checks[index] = check
        return checks

    def audit(
        self,
        versions: tuple[int, ...],
        groups: list[AdmittedGroup],
        statistics: list[GroupStatistic],
        tensors: TrainBatch,
    ) -> list[ExactCheck]:
        """Recompute these groups' log-probs with the weights of the versions that sampled them, and check
        their keyed sampling: one no-grad forward of their rows per version, each token compared with its own
        version's. Each group is charged its share of the wall time."""
        started_s = time.perf_counter()
        rows = torch.cat([torch.arange(s.first_row, s.first_row + s.num_samples) for s in statistics])
        by_position = position_versions(groups, tensors.completion_mask.shape[1])  # (b, T - 1)
        logprobs = torch.zeros(by_position.shape, dtype=torch.float32)
        gaps = torch.zeros(by_position.shape, dtype=torch.float32)
        for version in versions:
            model = self.model_at(version)
            device = next(model.parameters()).device
            with torch.no_grad(), self.compute():
                version_logprobs, version_gaps = audit_rows(
                    model,  # type: ignore[arg-type]
                    tensors.input_ids[rows].to(device),
                    tensors.attention_mask[rows].to(device),
                    tensors.temperatures[rows].to(device),
                    tensors.completion_mask[rows].to(device),
                    self.row_seeds(groups),
                )
            mine = by_position == version
            logprobs[mine] = version_logprobs.cpu().float()[mine]
            gaps[mine] = version_gaps.cpu().float()[mine]
        completion_mask = tensors.completion_mask[rows]
        num_samples = [s.num_samples for s in statistics]
        diffs = group_abs_diffs(logprobs, tensors.behaviour_logprobs[rows], completion_mask, num_samples)
        audit_s = (time.perf_counter() - started_s) / len(statistics)
        checks = []
        first_row = 0
        for admitted, (_, diff), count in zip(groups, diffs, num_samples, strict=True):
            span = slice(first_row, first_row + count)
            provenance = (
                group_provenance(gaps[span], completion_mask[span], self.config) if self.is_keyed(admitted) else None
            )
            checks.append(ExactCheck(diff, audit_s, provenance))
            first_row += count
        return checks

    def is_keyed(self, admitted: AdmittedGroup) -> bool:
        """Single-turn groups are sampled with keyed sampling (multi-turn episodes are not)."""
        return self.config.provenance and not admitted.group.rollout.completion_mask

    def row_seeds(self, groups: list[AdmittedGroup]) -> torch.Tensor:
        """(b,) the keyed-sampling seed of every row of these groups; -1 for groups that are not keyed."""
        seeds: list[int] = []
        for admitted in groups:
            rollout = admitted.group.rollout
            if self.is_keyed(admitted):
                seeds.extend(sample_seeds(rollout.task_id, rollout.num_samples))
            else:
                seeds.extend([-1] * rollout.num_samples)
        return torch.tensor(seeds, dtype=torch.int64)

    def model_at(self, version: int) -> torch.nn.Module:
        if self._audit_model is None:
            self._audit_model = copy.deepcopy(self.policy).eval().requires_grad_(False)
        if self._loaded_version != version:
            weights = self.cache.weights(version)
            assert weights is not None, f"version {version} is not cached"  # check() asked the cache first
            self._audit_model.load_state_dict(weights)
            self._loaded_version = version
        return self._audit_model
