"""The relay plan: who each rollout worker fetches a policy version from (pure; no I/O).

    rank      alive workers by the delivery their relay children observed, fastest first
              (a claimed bandwidth never ranks a worker: see "Trusting measurements" below)
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

Trusting measurements, not claims (issue 23, attack 7: a worker claiming 10 Gbit/s and serving nothing
became the seed, and its child fell ~290 versions behind). A worker's rank is its `Delivery`: what
its children reported receiving from it (bytes from it / the child's download time) on the versions
the coordinator assigned them to it.
    delivered  the lowest rate its children observed on their latest reports (bad news from one
               child is enough; good news needs every child)
    missed     a child had to fetch any part of a version elsewhere (it fell back): the worker is a
               leaf (no children) for 2^num_misses versions after that version (2, 4, 8, ... capped at
               MAX_PROBATION_VERSIONS), then ranks as a newcomer again; misses are never forgiven
               while it stays registered, so a persistent liar gets a child on at most
               log2(V) + 1 of V versions
    newcomer   no observation yet: ranked by min(its claim, its own measured download rate, the
               lowest delivery any observed parent achieved); the claim can only lower it. With no
               observed parent at all (the first version) the claim is all there is, so a liar can
               be the seed once, and is a leaf one version later
Why the whole version and not a share (issue 35): what a parent costs its child is the wait before the
child leaves it (stall_timeout_s for a parent that goes silent), whatever share it sent first. A rule of
"at least half" let a parent serve 60% of every version and then stall: never a miss, so it kept its
children version after version, each of them late by stall_timeout_s every time. The price: an honest
parent that dies mid-version, or whose own upstream stalls (it then ends its children's streams), is a
miss too, and a leaf for a while; a stalling upstream causes such misses only on the versions it has
children itself, which the rule keeps to log2(V) + 1.
A child's report can hurt only the parent the coordinator assigned it (the coordinator drops any
other): a lying child can put its own parent on probation, which delays nobody (the parent becomes a
leaf), and a colluding child can vouch for its parent only until another child of it reports.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MAX_FALLBACKS = 8
LEARNER = "learner"  # the parent id of a seed
MAX_PROBATION_VERSIONS = 1024


@dataclass(frozen=True)
class Delivery:
    """What a worker's relay children observed of it (services/coordinator/relay_view.py builds it)."""

    delivered_mbps: float | None = None  # lowest rate on its children's latest deliveries; None: none seen
    last_miss_version: int | None = None  # the newest version a child of it missed (fell back); None: never
    num_misses: int = 0  # versions its children missed, in all

    def on_probation(self, current_version: int | None) -> bool:
        """A leaf for 2^num_misses versions after its last miss (current_version None: unknown, still on)."""
        if self.last_miss_version is None:
            return False
        if current_version is None:
            return True
        return current_version < self.last_miss_version + probation_versions(self.num_misses)


def probation_versions(num_misses: int) -> int:
    return min(2 ** max(1, min(num_misses, 20)), MAX_PROBATION_VERSIONS)


@dataclass(frozen=True)
class ParentObservation:
    """A child's latest report of the parent it was assigned (kept by the coordinator's heartbeat script)."""

    child_id: str
    policy_version: int
    parent_url: str
    parent_bytes: int  # of num_bytes, what came from the parent
    num_bytes: int  # > 0
    seconds: float  # the announcement -> the child's verified weights ready (its clock against the learner's)

    @property
    def missed(self) -> bool:
        """The child fetched some of the version from another source: the parent did not deliver all of it
        (the heartbeat script applies the same rule: services/coordinator/heartbeat_batch.py)."""
        return self.parent_bytes < self.num_bytes

    @property
    def delivered_mbps(self) -> float:
        return self.parent_bytes * 8 / 1e6 / max(self.seconds, 1e-3)


def deliveries(observations: list[ParentObservation], misses: dict[str, tuple[int, int]]) -> dict[str, Delivery]:
    """By parent URL: the lowest rate of its children's latest deliveries, and its misses (URL ->
    (last missed version, count), counted by the heartbeat script once per missed report)."""
    delivered: dict[str, float] = {}
    for o in observations:
        if not o.missed:
            delivered[o.parent_url] = min(o.delivered_mbps, delivered.get(o.parent_url, float("inf")))
    return {url: Delivery(delivered.get(url), *misses.get(url, (None, 0))) for url in {*delivered, *misses}}


@dataclass(frozen=True)
class RelayCandidate:
    """What the planner knows about one worker."""

    worker_id: str
    endpoint_url: str  # its chunk server; "" if it cannot relay
    reported_mbps: float  # link speed it reported at registration (a claim)
    measured_mbps: float | None = None  # its own download rate on past versions, if measured (its claim too)
    alive: bool = True
    delivery: Delivery = Delivery()  # what its relay children observed

    @property
    def claimed_mbps(self) -> float:
        """The claim, lowered to its own measured download rate (a measurement can only lower it)."""
        if self.measured_mbps is None:
            return self.reported_mbps
        return min(self.reported_mbps, self.measured_mbps)

    @property
    def effective_mbps(self) -> float:
        """Without the rest of the fleet: what its children observed, else its claim (see rank_mbps)."""
        if self.delivery.delivered_mbps is not None:
            return self.delivery.delivered_mbps
        return self.claimed_mbps


def rank_mbps(candidate: RelayCandidate, newcomer_cap_mbps: float | None, current_version: int | None) -> float:
    """The rate `candidate` is ranked by (module doc): 0 on probation, its observed delivery, else the
    newcomer prior min(claim, `newcomer_cap_mbps`)."""
    delivery = candidate.delivery
    if delivery.on_probation(current_version):
        return 0.0
    if delivery.delivered_mbps is not None:
        return delivery.delivered_mbps
    claim = candidate.claimed_mbps
    return claim if newcomer_cap_mbps is None else min(claim, newcomer_cap_mbps)


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


def plan_relay(
    candidates: list[RelayCandidate], *, num_seeds: int = 1, fanout: int = 1, current_version: int | None = None
) -> RelayPlan:
    """Assign every alive candidate a parent: the learner for the first `num_seeds` by rank, then the
    earliest free slot of a relaying worker (each offers `fanout`). `current_version`: the newest
    announced one, which ends a probation (None: probations hold)."""
    if num_seeds < 1 or fanout < 1:
        raise ValueError(f"num_seeds and fanout must be at least 1, got {num_seeds} and {fanout}")
    alive = [c for c in candidates if c.alive]
    observed = [
        c.delivery.delivered_mbps
        for c in alive
        if c.delivery.delivered_mbps is not None and not c.delivery.on_probation(current_version)
    ]
    newcomer_cap = min(observed) if observed else None
    score = {c.worker_id: rank_mbps(c, newcomer_cap, current_version) for c in alive}
    # ties: observed parents before newcomers, then the claim (it can only matter among equals)
    ranked = sorted(
        alive,
        key=lambda c: (-score[c.worker_id], c.delivery.delivered_mbps is None, -c.claimed_mbps, c.worker_id),
    )
    parent_of: dict[str, str] = {}
    depth_of: dict[str, int] = {LEARNER: 0}
    free_slots: deque[str] = deque([LEARNER] * num_seeds)
    for candidate in ranked:
        # a worker with no free slot left anywhere (every relayer is a leaf) hangs off the learner
        parent_id = free_slots.popleft() if free_slots else LEARNER
        parent_of[candidate.worker_id] = parent_id
        depth_of[candidate.worker_id] = depth_of[parent_id] + 1
        if candidate.endpoint_url and not candidate.delivery.on_probation(current_version):
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
            fallback_urls=tuple(_fallbacks(c.worker_id, ancestors_of, by_depth, by_id, current_version)),
            effective_mbps=score[c.worker_id],
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
    worker_id: str,
    ancestors_of: dict[str, list[str]],
    by_depth: list[str],
    by_id: dict[str, RelayCandidate],
    current_version: int | None,
) -> list[str]:
    """Other ancestors nearest first, then other branches shallowest first; no descendants; relayers
    only, and never one on probation (it failed a child lately)."""
    ancestors = ancestors_of[worker_id]
    chosen = ancestors[1:]
    excluded = {worker_id, *ancestors}
    for other in by_depth:
        if len(chosen) >= MAX_FALLBACKS:
            break
        if other not in excluded and worker_id not in ancestors_of[other]:
            chosen.append(other)
    usable = [n for n in chosen if by_id[n].endpoint_url and not by_id[n].delivery.on_probation(current_version)]
    return [by_id[node].endpoint_url for node in usable][:MAX_FALLBACKS]
