"""The relay plan: who each rollout worker fetches a policy version from (pure; no I/O).

    rank      alive workers by the delivery their relay children observed, fastest first
              (a claimed bandwidth never ranks a worker: see "Trusting measurements" below)
    relayers  the workers others may fetch from ("Relayers and leaves" below), in rank order: the
              first `num_seeds` get the learner as parent, the rest the earliest free child slot,
              where every relayer offers `fanout` slots (fanout 1: `num_seeds` chains, filled
              round-robin; fanout 2: binary trees)
    leaves    everyone else, in rank order: the slots left, then the relayer feeding the fewest children

Why this shape: with pipelining, a chain moves a version to everyone in about size / B + depth *
chunk time, and every link carries one copy, so the learner uploads `num_seeds` copies in all. The
rate of a chain is its slowest link above a worker, so ranking fastest-first puts slow workers at the
tails, where they slow nobody but themselves. More seeds split the learner's uplink; they only pay
when it is faster than a worker's link (or to shorten chains when the chunk time matters).

Relayers and leaves. A worker is a relayer (a parent, a fallback) only when it serves chunks (an endpoint
URL), the coordinator's connect-back probe reached that chunk server (`inbound_reachable` True:
services/coordinator/reachability.py), and it is not on probation (below). Anyone else is a leaf: it
fetches like everyone but nobody is planned to wait on it. A worker behind NAT or a firewall is a leaf, and
so is one not probed yet: a probe takes milliseconds at registration, while a parent nobody can reach
costs each child `chunk_wait_s` per version. Relayers are placed first, in rank order; leaves then take
the slots left (the tails of the chains, so a leaf never breaks a chain and sends the next relayer to
the learner), and past those each goes to the relayer feeding the fewest children (the deepest among
equals), which keeps the uploads balanced; only with no relayer at all do leaves hang off the learner.
Each worker also gets fallbacks for when its parent dies or stalls: its other ancestors nearest first
(they hold everything the parent held), then relayers on other branches by depth; never its own
descendants (they get the data through it). The learner is the last resort of every worker and is not
listed.

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

import heapq
from collections import Counter, deque
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
    # the coordinator's connect-back probe reached its chunk server; False: it did not (NAT, a firewall);
    # None: not probed yet (either way a leaf)
    inbound_reachable: bool | None = True

    def relays(self, current_version: int | None) -> bool:
        """Whether others may be planned to fetch from it: it serves chunks, the probe reached them, and it
        is not on probation."""
        return (
            bool(self.endpoint_url)
            and self.inbound_reachable is True
            and not self.delivery.on_probation(current_version)
        )

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
    relayer_ids: tuple[str, ...] = ()  # the workers others may fetch from, shallowest first

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
    """Assign every alive candidate a parent: relayers first, by rank, the learner for the first
    `num_seeds` then the earliest free slot of a relayer (each offers `fanout`); then the leaves (module
    doc). `current_version`: the newest announced one, which ends a probation (None: probations hold)."""
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
    relayers = [c.worker_id for c in ranked if c.relays(current_version)]
    leaves = [c.worker_id for c in ranked if not c.relays(current_version)]
    parent_of: dict[str, str] = {}
    depth_of: dict[str, int] = {LEARNER: 0}
    free_slots: deque[str] = deque([LEARNER] * num_seeds)
    for worker_id in relayers:  # never out of slots: each relayer offers at least one for the one it takes
        _attach(worker_id, free_slots.popleft(), parent_of, depth_of)
        free_slots.extend([worker_id] * fanout)
    least_loaded: _LeastLoaded | None = None  # counts children once the free slots are gone
    for worker_id in leaves:
        if free_slots:
            parent_id = free_slots.popleft()
        else:
            if least_loaded is None:
                least_loaded = _LeastLoaded(relayers, parent_of, depth_of)
            parent_id = least_loaded.take()
        _attach(worker_id, parent_id, parent_of, depth_of)
    by_id = {c.worker_id: c for c in ranked}
    ancestors_of = {worker_id: _ancestors(worker_id, parent_of) for worker_id in parent_of}
    relayers_by_depth = sorted(relayers, key=lambda worker_id: depth_of[worker_id])  # stable: rank within a depth
    assignments = {
        c.worker_id: RelayAssignment(
            worker_id=c.worker_id,
            parent_id=parent_of[c.worker_id],
            parent_url=by_id[parent_of[c.worker_id]].endpoint_url if parent_of[c.worker_id] != LEARNER else "",
            depth=depth_of[c.worker_id],
            fallback_urls=tuple(_fallbacks(c.worker_id, ancestors_of, relayers_by_depth, by_id)),
            effective_mbps=score[c.worker_id],
        )
        for c in ranked
    }
    return RelayPlan(assignments, tuple(relayers_by_depth))


def _attach(worker_id: str, parent_id: str, parent_of: dict[str, str], depth_of: dict[str, int]) -> None:
    parent_of[worker_id] = parent_id
    depth_of[worker_id] = depth_of[parent_id] + 1


class _LeastLoaded:
    """The parent of a leaf once the free slots are gone: the relayer feeding the fewest children, the
    deepest among equals (then by rank), so no relayer uploads to many leaves while another feeds one; the
    learner when nobody relays."""

    def __init__(self, relayers: list[str], parent_of: dict[str, str], depth_of: dict[str, int]) -> None:
        num_children = Counter(parent_of.values())
        self._heap = [(num_children[r], -depth_of[r], rank, r) for rank, r in enumerate(relayers)]
        heapq.heapify(self._heap)

    def take(self) -> str:
        if not self._heap:
            return LEARNER
        num_children, minus_depth, rank, relayer = self._heap[0]
        heapq.heapreplace(self._heap, (num_children + 1, minus_depth, rank, relayer))
        return relayer


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
    relayers_by_depth: list[str],
    by_id: dict[str, RelayCandidate],
) -> list[str]:
    """Other ancestors nearest first (every ancestor is a relayer), then relayers on other branches
    shallowest first; no descendants, never a leaf (unreachable, unprobed, on probation or without a
    chunk server)."""
    ancestors = ancestors_of[worker_id]
    chosen = ancestors[1:]
    excluded = {worker_id, *ancestors}
    for other in relayers_by_depth:
        if len(chosen) >= MAX_FALLBACKS:
            break
        if other not in excluded and worker_id not in ancestors_of[other]:
            chosen.append(other)
    return [by_id[node].endpoint_url for node in chosen][:MAX_FALLBACKS]
