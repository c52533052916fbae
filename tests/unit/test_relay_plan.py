"""The relay plan (shared/relay_plan.py): seeds, ordering by bandwidth, fallbacks, re-planning."""

from __future__ import annotations

import pytest

from shared.relay_plan import LEARNER, RelayCandidate, RelayPlan, plan_relay


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

    assert parents(plan) == {"a": LEARNER, "b": "a", "c": "a", "d": "c", "e": "c"}  # b has no chunk server: no children
    assert plan.children_of("a") == ["b", "c"]


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
