"""Continuous batching: the engine's batch stays full, and the weights may change between two decoding steps.

A worker adds samples (`SampleRequest`, one row each) whenever it has them; every `step()` first admits
waiting rows into the running batch (up to `max_rows`), then decodes one token for every row, and returns
the rows that finished (EOS or their `max_new_tokens`). A row never waits for the batch's longest sample:
its place goes to the next waiting row at the next step.

Weights: the worker calls the engine's `load_weights` between two steps, while rows are in flight. The
next step sees the engine's new `policy_version` and first recomputes every row's context (prompt and the
tokens it sampled so far) under the new weights: the KV cache made by the old weights is dropped, so every
later token is sampled from, and its behaviour log-prob is, exactly the new version's distribution given
the whole context. Each row records the version of each token as change points (`VersionChange`): a sample
that started under version 4 and saw version 5 land after 12 tokens has ((0, 4), (12, 5)).

This module imports neither torch nor vllm.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from engines.interface import Sample, Sampling
from engines.prompts import check_prompt_ids


@dataclass(frozen=True)
class VersionChange:
    """From completion token `token_index` on (until the next change), tokens were sampled with
    `policy_version`."""

    token_index: int
    policy_version: int


def record_change(versions: list[VersionChange], token_index: int, policy_version: int) -> None:
    """A row's tokens from `token_index` on come from `policy_version` (replacing a change at the same token:
    a row that has sampled nothing since the last change)."""
    if versions and versions[-1].token_index == token_index:
        versions.pop()
    versions.append(VersionChange(token_index, policy_version))


@dataclass(frozen=True)
class SampleRequest:
    """One sample to draw: one row of the engine's batch. Raises ValueError unless `sampling` is one drawn
    sample (num_samples 1, not greedy: a continuous batch samples every row)."""

    request_id: int  # the caller's key: each FinishedSample names it
    prompt_ids: tuple[int, ...]  # the context to continue (already encoded and checked)
    sampling: Sampling
    seed: int | None = None  # keyed sampling's seed for this sample (shared/keyed_sampling.py); None: random

    def __post_init__(self) -> None:
        if self.sampling.num_samples != 1 or self.sampling.greedy:
            raise ValueError(f"a row is one drawn sample (num_samples 1, not greedy), not {self.sampling}")


@dataclass(frozen=True)
class FinishedSample:
    request_id: int
    sample: Sample
    versions: tuple[VersionChange, ...]  # at least one; the first at token 0

    @property
    def oldest_version(self) -> int:
        return min(change.policy_version for change in self.versions)


@dataclass(frozen=True)
class StepStats:
    """What one `step()` did: for occupancy and swap-pause accounting."""

    num_rows: int  # rows decoded this step (the batch's occupancy)
    num_admitted: int
    num_finished: int
    recompute_s: float  # time spent re-prefilling in-flight rows after a weight change (0: none)


@dataclass
class Row:
    """One running sample: what it has sampled so far, and with which versions."""

    request: SampleRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[VersionChange] = field(default_factory=list)


class ContinuousBatch(ABC):
    """A running batch of at most `max_rows` rows on one engine. The base holds what every engine's batch
    does alike: checking and queueing requests, the version the running rows follow, the last step's stats."""

    def __init__(self, max_rows: int, max_positions: int | None, policy_version: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.max_positions = max_positions  # the engine's context (None: unknown)
        self.waiting: deque[SampleRequest] = deque()
        self.policy_version = policy_version  # the weights the running rows were last computed with
        self._last_step: StepStats | None = None

    def add(self, requests: Sequence[SampleRequest]) -> None:
        """Queue rows; they enter the batch at the next step with room. Raises ValueError for a bad request
        (the batch is unchanged)."""
        for request in requests:  # every request checked before any is queued
            check_prompt_ids([request.prompt_ids], request.sampling.max_new_tokens, self.max_positions)
        self.waiting.extend(requests)

    @abstractmethod
    def step(self) -> list[FinishedSample]:
        """Admit, decode one token per row, return the rows that finished (maybe none)."""

    @abstractmethod
    def abort(self, request_ids: Sequence[int]) -> None:
        """Drop these rows, running or waiting (unknown ids are ignored)."""

    @property
    @abstractmethod
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def last_step(self) -> StepStats | None:
        return self._last_step

    def take_waiting(self) -> list[SampleRequest]:
        """The waiting requests that fit in the places the running rows leave, in order."""
        room = min(self.max_rows - self.num_running, len(self.waiting))
        return [self.waiting.popleft() for _ in range(room)]

    def drop_waiting(self, request_ids: set[int]) -> None:
        self.waiting = deque(r for r in self.waiting if r.request_id not in request_ids)
