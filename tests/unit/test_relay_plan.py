"""The relay plan (shared/weight_channel/relay_plan.py): seeds, ordering by observed delivery (claims only for newcomers),
probation of parents that do not deliver, workers nobody can reach, fallbacks, re-planning."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shared.weight_channel import (
    LEARNER,
    Delivery,
    ParentObservation,
    RelayCandidate,
    RelayPlan,
    deliveries,
    plan_relay,
)
from shared.weight_channel.relay_plan import MAX_PROBATION_VERSIONS, probation_versions


def worker(
    worker_id: str, mbps: float, *, measured: float | None = None, alive: bool = True, relays: bool = True
) -> RelayCandidate:
    return RelayCandidate(worker_id, f"http://{worker_id}" if relays else "", mbps, measured, alive)


def parents(plan: RelayPlan) -> dict[str, str]:
    return {a.worker_id: a.parent_id for a in plan.assignments.values()}


def test_the_fastest_workers_are_seeds_and_the_rest_form_chains_fastest_first() -> None:
    plan = plan_relay([worker(f"w{mbps}", mbps) for mbps in (100, 400, 200, 300, 50, 250)], num_seeds=2)

    assert parents(plan) == {
        "w400": LEARNER,
        "w300": LEARNER,  # seeds: the two fastest
        "w250": "w400",
        "w200": "w300",  # then round-robin onto the chains, so each chain runs fast to slow
        "w100": "w250",
        "w50": "w200",
    }
    assert [a.depth for a in plan.assignments.values()] == [1, 1, 2, 2, 3, 3]
    assert plan.assignments["w400"].parent_url == ""  # the learner: the worker uses the announcement's URL
    assert plan.assignments["w250"].parent_url == "http://w400"
    assert plan.max_depth == 3


def test_fanout_builds_a_tree_and_a_worker_that_cannot_relay_is_a_leaf() -> None:
    candidates = [
        worker("a", 500),
        worker("b", 400, relays=False),
        worker("c", 300),
        worker("d", 200),
        worker("e", 100),
    ]

    plan = plan_relay(candidates, num_seeds=1, fanout=2)

    # b has no chunk server: no children, and a slot only once every relayer has one (d moves up a level)
    assert parents(plan) == {"a": LEARNER, "c": "a", "d": "a", "e": "c", "b": "c"}
    assert plan.children_of("a") == ["c", "d"]
    assert plan.relayer_ids == ("a", "c", "d", "e")


def test_a_worker_the_coordinator_cannot_reach_or_has_not_probed_is_a_leaf_and_nobodys_fallback() -> None:
    """Issue 36, item 3: behind NAT (the probe failed) or not probed yet, it still fetches, once every
    relayer has its place, and nobody is planned to wait on it, however fast it claims to be."""
    candidates = [
        RelayCandidate("nat", "http://nat", 10_000.0, inbound_reachable=False),
        worker("a", 300),
        RelayCandidate("unprobed", "http://unprobed", 200.0, inbound_reachable=None),
        worker("b", 100),
    ]

    plan = plan_relay(candidates)

    # the free slot at the chain's tail, then the relayer feeding the fewest children (the deeper of a tie)
    assert parents(plan) == {"a": LEARNER, "b": "a", "nat": "b", "unprobed": "b"}
    assert plan.children_of("nat") == plan.children_of("unprobed") == []
    assert plan.relayer_ids == ("a", "b")
    fallbacks = {url for a in plan.assignments.values() for url in a.fallback_urls}
    assert fallbacks == {"http://a"}  # the leaves' grandparent; never a leaf
    # a probe reaches it: it relays, and its claim makes it the seed (as for any newcomer)
    reached = [replace(candidates[0], inbound_reachable=True), *candidates[1:]]
    assert parents(plan_relay(reached))["a"] == "nat"


def test_leaves_fill_the_free_slots_then_spread_over_the_relayers_not_the_learner() -> None:
    """Chains (fanout 1) of three relayers leave one free slot, at the tail; the other leaves go to the relayer
    feeding the fewest children, the deepest among equals: the learner still uploads one copy and no relayer
    uploads to all the leaves."""
    relayers = [worker(f"r{i}", 100 - i) for i in range(3)]  # r0 -> r1 -> r2
    leaves = [RelayCandidate(f"l{i}", f"http://l{i}", 50.0 - i, inbound_reachable=False) for i in range(5)]

    plan = plan_relay(relayers + leaves)

    assert parents(plan) == {
        "r0": LEARNER,
        "r1": "r0",
        "r2": "r1",
        "l0": "r2",  # the free slot
        "l1": "r2",
        "l2": "r1",
        "l3": "r0",
        "l4": "r2",  # every relayer feeds two, the deepest first
    }
    assert plan.children_of(LEARNER) == ["r0"]
    assert set(parents(plan_relay(leaves)).values()) == {LEARNER}  # nobody relays: the learner feeds them all


def test_a_measured_throughput_lowers_a_workers_rank_but_never_raises_it() -> None:
    claims_much = worker("claims-much", 1000, measured=80)  # reported 1 Gbit/s, achieved 80 Mbit/s
    modest = worker("modest", 200, measured=5000)  # a measurement above the claim does not count
    plan = plan_relay([claims_much, modest, worker("middle", 150)])

    assert parents(plan) == {"modest": LEARNER, "middle": "modest", "claims-much": "middle"}
    assert plan.assignments["claims-much"].effective_mbps == 80


def test_fallbacks_are_the_other_ancestors_then_other_branches_never_descendants() -> None:
    plan = plan_relay([worker(f"w{i}", 100 - i) for i in range(7)], num_seeds=2)
    # chains: w0 -> w2 -> w4 -> w6 and w1 -> w3 -> w5
    assert parents(plan)["w4"] == "w2" and parents(plan)["w6"] == "w4"

    fallbacks = plan.assignments["w4"].fallback_urls
    assert fallbacks[0] == "http://w0"  # its grandparent holds everything its parent held
    assert "http://w6" not in fallbacks and "http://w2" not in fallbacks  # its child; its parent
    assert set(fallbacks[1:]) == {"http://w1", "http://w3", "http://w5"}
    assert "http://w4" not in plan.assignments["w2"].fallback_urls  # w4 gets its data through w2


def test_the_plan_follows_deaths_and_joins() -> None:
    alive = [worker(f"w{i}", 100 - i) for i in range(4)]  # a chain w0 -> w1 -> w2 -> w3
    assert parents(plan_relay(alive)) == {"w0": LEARNER, "w1": "w0", "w2": "w1", "w3": "w2"}

    w1_dead = [alive[0], worker("w1", 99, alive=False), *alive[2:]]
    assert parents(plan_relay(w1_dead)) == {"w0": LEARNER, "w2": "w0", "w3": "w2"}  # w2 moves up to w0

    joined = [*alive, worker("fast-newcomer", 1000)]
    assert parents(plan_relay(joined)) == {
        "fast-newcomer": LEARNER,
        "w0": "fast-newcomer",
        "w1": "w0",
        "w2": "w1",
        "w3": "w2",
    }


def test_ties_are_broken_by_id_so_every_coordinator_computes_the_same_plan() -> None:
    candidates = [worker(name, 100) for name in ("c", "a", "b")]
    assert (
        parents(plan_relay(candidates))
        == parents(plan_relay(list(reversed(candidates))))
        == {"a": LEARNER, "b": "a", "c": "b"}
    )


def test_bad_parameters_and_an_empty_cluster() -> None:
    assert plan_relay([]).assignments == {}
    with pytest.raises(ValueError, match="at least 1"):
        plan_relay([worker("a", 1)], num_seeds=0)


def test_a_parent_is_ranked_by_what_its_children_observed_not_by_its_claim() -> None:
    observed = Delivery(delivered_mbps=90.0)
    plan = plan_relay(
        [
            RelayCandidate("claims-much", "http://claims-much", 10_000.0, delivery=Delivery(delivered_mbps=20.0)),
            RelayCandidate("delivers", "http://delivers", 100.0, delivery=observed),
            worker("newcomer", 5_000),  # no observation: min(its claim, the slowest observed parent) = 20
        ],
        current_version=5,
    )
    assert parents(plan) == {"delivers": LEARNER, "claims-much": "delivers", "newcomer": "claims-much"}
    assert plan.assignments["newcomer"].effective_mbps == 20.0


def test_deliveries_take_the_worst_child_report_and_count_misses() -> None:
    observations = [
        ParentObservation("c1", 7, "http://p", parent_bytes=100_000_000, num_bytes=100_000_000, seconds=8.0),
        ParentObservation("c2", 7, "http://p", parent_bytes=100_000_000, num_bytes=100_000_000, seconds=16.0),
        ParentObservation("c3", 7, "http://q", parent_bytes=10, num_bytes=100_000_000, seconds=15.0),  # fell back
    ]
    by_url = deliveries(observations, {"http://q": (7, 1)})
    assert by_url["http://p"] == Delivery(delivered_mbps=50.0)  # the slower child's view: 100 MB in 16 s
    assert by_url["http://q"] == Delivery(None, last_miss_version=7, num_misses=1)
    assert observations[2].missed and not observations[0].missed


def simulate_poisoning(num_versions: int, liar_share: float = 0.0) -> tuple[list[int], list[str]]:
    """Issue 23, attack 7, version by version: a worker claiming 10 Gbit/s serves `liar_share` of each
    version and then stalls (issue 35: 0.6 was never a miss). Each version the coordinator plans; a child
    of the liar falls back for the rest (its version is late by the child-side bound) and reports what it
    got, which the heartbeat script counts as a miss by the rule; an honest parent delivers its rate.
    Returns the versions on which some child was late, and the liar's parent per version."""
    honest = {f"h{i}": 100.0 + 10 * i for i in range(5)}
    url = {w: f"http://{w}" for w in [*honest, "liar"]}
    observations: dict[str, ParentObservation] = {}
    misses: dict[str, tuple[int, int]] = {}
    late_versions: list[int] = []
    liar_parents: list[str] = []
    for version in range(num_versions):
        by_url = deliveries(list(observations.values()), misses)
        candidates = [
            RelayCandidate(w, url[w], mbps, delivery=by_url.get(url[w], Delivery())) for w, mbps in honest.items()
        ] + [RelayCandidate("liar", url["liar"], 10_000.0, delivery=by_url.get(url["liar"], Delivery()))]
        plan = plan_relay(candidates, current_version=version)
        liar_parents.append(plan.assignments["liar"].parent_id)
        for child in plan.children_of("liar"):
            late_versions.append(version)
            observations[child] = ParentObservation(child, version, url["liar"], int(liar_share * 10**8), 10**8, 15.0)
            if observations[child].missed:
                _, count = misses.get(url["liar"], (version, 0))
                misses[url["liar"]] = (version, count + 1)
        for assignment in plan.assignments.values():
            if assignment.parent_id not in (LEARNER, "liar"):
                mbps = honest[assignment.parent_id]
                observations[assignment.worker_id] = ParentObservation(
                    assignment.worker_id, version, assignment.parent_url, 10**8, 10**8, 10**8 * 8 / 1e6 / mbps
                )
    return late_versions, liar_parents


def test_relay_poisoning_a_liar_is_demoted_after_one_version_and_its_children_stay_bounded() -> None:
    late_versions, liar_parents = simulate_poisoning(300)

    # version 0: nothing observed yet, so the claim seeds it once (the only version a claim decides)
    assert liar_parents[0] == LEARNER
    # version 1: its child's miss makes it a leaf (no children) for 2 versions; after that it ranks as a
    # newcomer, at most as the slowest observed parent: below every relayer, so the tail, a leaf again
    assert liar_parents[1] != LEARNER and late_versions == [0]
    assert all(parent_id != LEARNER for parent_id in liar_parents[1:])
    # the general bound (a newcomer below it would be its child once per probation, which doubles):
    assert len(late_versions) <= math.floor(math.log2(300)) + 1


@pytest.mark.parametrize("liar_share", [0.6, 0.999])
def test_a_parent_that_serves_most_of_every_version_and_stalls_is_bounded_like_one_that_serves_nothing(
    liar_share: float,
) -> None:
    """Issue 35, item 5: under the half-a-version rule a parent delivering 60% was never a miss and kept
    its child on all 300 versions; a parent that did not deliver the whole version is a miss."""
    late_versions, _ = simulate_poisoning(300, liar_share)

    assert late_versions[0] == 0 and len(late_versions) <= math.floor(math.log2(300)) + 1


def test_a_miss_is_any_part_of_the_version_fetched_elsewhere() -> None:
    def seen(parent_bytes: int) -> ParentObservation:
        return ParentObservation("c", 3, "http://p", parent_bytes=parent_bytes, num_bytes=1000, seconds=1.0)

    assert seen(0).missed and seen(600).missed and seen(999).missed
    assert not seen(1000).missed


def test_a_parent_on_probation_is_a_leaf_and_no_ones_fallback_and_comes_back_after_it() -> None:
    missed = Delivery(delivered_mbps=None, last_miss_version=10, num_misses=2)  # probation: 4 versions
    candidates = [worker("a", 300), RelayCandidate("b", "http://b", 200.0, delivery=missed), worker("c", 100)]

    during = plan_relay(candidates, current_version=13)
    assert parents(during) == {"a": LEARNER, "c": "a", "b": "c"}  # b ranked last, and a leaf
    assert "http://b" not in during.assignments["c"].fallback_urls
    after = plan_relay(candidates, current_version=14)
    assert parents(after) == {"a": LEARNER, "b": "a", "c": "b"}  # a newcomer again, ranked by its claim
    assert probation_versions(1) == 2 and probation_versions(50) == MAX_PROBATION_VERSIONS
