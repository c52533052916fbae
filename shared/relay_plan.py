"""The relay plan: who each rollout worker fetches a policy version from (pure; no I/O).

    rank      alive workers by effective bandwidth, fastest first
              (effective = reported Mbit/s, lowered to the throughput measured on past versions)
    seeds     the first `num_seeds` get the learner as parent
    the rest  take the earliest free child slot, where every relaying worker offers `fanout` slots
              (fanout 1: `num_seeds` chains, filled round-robin; fanout 2: binary trees)

Why this shape: with pipelining, a chain moves a version to everyone in about size / B + depth *
chunk time, and every link carries one copy, so the learner uploads `num_seeds` copies in all. The
rate of a chain is its slowest link above a worker, so ranking fastest-first puts slow workers at the
tails, where they slow nobody but themselves. More seeds split the learner's uplink; they only pay
when it is faster than a worker's link (or to shorten chains when the chunk time matters).

A worker that cannot serve chunks (no endpoint URL) is a leaf. Each worker also gets fallbacks for when
its parent dies or stalls: its other ancestors nearest first (they hold everything the parent held),
then workers on other branches by depth; never its own descendants (they get the data through it).
The learner is the last resort of every worker and is not listed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MAX_FALLBACKS = 8
LEARNER = "learner"  # the parent id of a seed


@dataclass(frozen=True)
class RelayCandidate:
    """What the planner knows about one worker."""

    worker_id: str
    endpoint_url: str  # its chunk server; "" if it cannot relay
    reported_mbps: float  # link speed it reported at registration
    measured_mbps: float | None = None  # throughput achieved on past versions, if measured
    alive: bool = True

    @property
    def effective_mbps(self) -> float:
        """The claim, lowered to what was measured (a measurement can only lower it: a child in a chain
        never measures more than its parent sends, so a high measurement says little)."""
        if self.measured_mbps is None:
            return self.reported_mbps
        return min(self.reported_mbps, self.measured_mbps)


@dataclass(frozen=True)
class RelayAssignment:
    worker_id: str
    parent_id: str  # LEARNER or a worker id
    parent_url: str  # "" for the learner: the worker uses the URL of the announcement
    depth: int  # 1 for a seed
    fallback_urls: tuple[str, ...]
    effective_mbps: float


@dataclass(frozen=True)
class RelayPlan:
    assignments: dict[str, RelayAssignment]  # by worker id, in rank order

    def parent_of(self, worker_id: str) -> RelayAssignment | None:
        return self.assignments.get(worker_id)

    def children_of(self, parent_id: str) -> list[str]:
        return [a.worker_id for a in self.assignments.values() if a.parent_id == parent_id]

    @property
    def max_depth(self) -> int:
        return max((a.depth for a in self.assignments.values()), default=0)


def plan_relay(candidates: list[RelayCandidate], *, num_seeds: int = 1, fanout: int = 1) -> RelayPlan:
    """Assign every alive candidate a parent: the learner for the first `num_seeds` by rank, then the
    earliest free slot of a relaying worker (each offers `fanout`)."""
    if num_seeds < 1 or fanout < 1:
        raise ValueError(f"num_seeds and fanout must be at least 1, got {num_seeds} and {fanout}")
    ranked = sorted(
        (c for c in candidates if c.alive),
        key=lambda c: (-c.effective_mbps, -c.reported_mbps, c.worker_id),
    )
    parent_of: dict[str, str] = {}
    depth_of: dict[str, int] = {LEARNER: 0}
    free_slots: deque[str] = deque([LEARNER] * num_seeds)
    for candidate in ranked:
        # a worker with no free slot left anywhere (every relayer is a leaf) hangs off the learner
        parent_id = free_slots.popleft() if free_slots else LEARNER
        parent_of[candidate.worker_id] = parent_id
        depth_of[candidate.worker_id] = depth_of[parent_id] + 1
        if candidate.endpoint_url:
            free_slots.extend([candidate.worker_id] * fanout)
    by_id = {c.worker_id: c for c in ranked}
    ancestors_of = {worker_id: _ancestors(worker_id, parent_of) for worker_id in parent_of}
    by_depth = sorted(parent_of, key=lambda worker_id: depth_of[worker_id])  # stable: rank within a depth
    assignments = {
        c.worker_id: RelayAssignment(
            worker_id=c.worker_id,
            parent_id=parent_of[c.worker_id],
            parent_url=by_id[parent_of[c.worker_id]].endpoint_url if parent_of[c.worker_id] != LEARNER else "",
            depth=depth_of[c.worker_id],
            fallback_urls=tuple(_fallbacks(c.worker_id, ancestors_of, by_depth, by_id)),
            effective_mbps=c.effective_mbps,
        )
        for c in ranked
    }
    return RelayPlan(assignments)


def _ancestors(worker_id: str, parent_of: dict[str, str]) -> list[str]:
    """Parent, grandparent, ... up to (not including) the learner."""
    chain = []
    node = parent_of[worker_id]
    while node != LEARNER:
        chain.append(node)
        node = parent_of[node]
    return chain


def _fallbacks(
    worker_id: str, ancestors_of: dict[str, list[str]], by_depth: list[str], by_id: dict[str, RelayCandidate]
) -> list[str]:
    """Other ancestors nearest first, then other branches shallowest first; no descendants; relayers only."""
    ancestors = ancestors_of[worker_id]
    chosen = ancestors[1:]
    excluded = {worker_id, *ancestors}
    for other in by_depth:
        if len(chosen) >= MAX_FALLBACKS:
            break
        if other not in excluded and worker_id not in ancestors_of[other]:
            chosen.append(other)
    return [by_id[node].endpoint_url for node in chosen if by_id[node].endpoint_url][:MAX_FALLBACKS]
