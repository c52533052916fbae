"""Fault injection: a rollout worker that lies, FOR TESTS AND MEASUREMENT ONLY (docs/trust.md).

    RL_FAULT_INJECT=garbage_logprobs   behaviour log-probs replaced by random numbers
    RL_FAULT_INJECT=stale_weights      stops loading weights after RL_FAULT_STALE_AFTER_VERSION (default 2)
                                       but claims the newest announced version for every group
    RL_FAULT_INJECT=swapped_text       completion token ids replaced by other (valid) ids of the group,
                                       the text and log-probs kept: reward on one thing, training on another

Refused unless RL_ALLOW_FAULT_INJECTION=1 is set as well, so a stray variable in a real deployment cannot
turn a worker into a liar. The fault suite and `make bench-trust` start such workers
(cluster/local.py: ClusterOptions.liars) to check that the learner's trust score catches them.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from enum import StrEnum

import numpy as np

from shared.messages import RolloutGroup, pack_float32, pack_int32, unpack_float32, unpack_int32

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER_VERSION = 2


class FaultKind(StrEnum):
    GARBAGE_LOGPROBS = "garbage_logprobs"
    STALE_WEIGHTS = "stale_weights"
    SWAPPED_TEXT = "swapped_text"


class FaultInjector:
    """What a lying worker does differently; the worker asks it at three points (see worker.py)."""

    def __init__(self, kind: FaultKind, stale_after_version: int = DEFAULT_STALE_AFTER_VERSION, seed: int = 0) -> None:
        self.kind = kind
        self.stale_after_version = stale_after_version
        self._rng = random.Random(seed)
        self._np_rng = np.random.default_rng(seed)

    def loads_weights(self, loaded_version: int) -> bool:
        """stale_weights: no more swaps once `stale_after_version` is loaded."""
        return self.kind != FaultKind.STALE_WEIGHTS or loaded_version < self.stale_after_version

    def claimed_version(self, loaded_version: int, newest_announced: int | None) -> int:
        """The version the worker writes on its groups (and gates on): stale_weights claims the newest."""
        if self.kind == FaultKind.STALE_WEIGHTS and newest_announced is not None and loaded_version >= 0:
            return max(loaded_version, newest_announced)
        return loaded_version

    def apply(self, group: RolloutGroup) -> RolloutGroup:
        """The group as the liar posts it."""
        if self.kind == FaultKind.GARBAGE_LOGPROBS:
            num_tokens = len(unpack_float32(group.behaviour_logprobs))
            garbage = self._np_rng.uniform(-8.0, -0.01, size=num_tokens)
            return group.model_copy(update={"behaviour_logprobs": pack_float32(garbage)})
        if self.kind == FaultKind.SWAPPED_TEXT:
            completion = unpack_int32(group.completion_token_ids)
            pool = np.concatenate([group.prompt_tokens(), completion])  # ids the vocabulary surely has
            swapped = self._np_rng.choice(pool, size=len(completion))
            return group.model_copy(update={"completion_token_ids": pack_int32(swapped)})
        return group


def fault_from_environment(environ: Mapping[str, str] = os.environ) -> FaultInjector | None:
    """The injector RL_FAULT_INJECT names, or None. Raises ValueError for an unknown kind, or when
    RL_ALLOW_FAULT_INJECTION=1 is missing (test-only switch)."""
    name = environ.get("RL_FAULT_INJECT", "")
    if not name:
        return None
    if environ.get("RL_ALLOW_FAULT_INJECTION") != "1":
        raise ValueError("RL_FAULT_INJECT is for tests and measurement only: set RL_ALLOW_FAULT_INJECTION=1 too")
    try:
        kind = FaultKind(name)
    except ValueError:
        raise ValueError(f"RL_FAULT_INJECT={name!r}: expected one of {[k.value for k in FaultKind]}") from None
    stale_after = int(environ.get("RL_FAULT_STALE_AFTER_VERSION", DEFAULT_STALE_AFTER_VERSION))
    log.warning("FAULT INJECTION ON (%s): this worker lies on purpose (tests and measurement only)", kind.value)
    return FaultInjector(kind, stale_after_version=stale_after)
