"""shared/activation.py: order by price per throughput, the margin, hysteresis (no flapping), estimates."""

from __future__ import annotations

import math

from shared.activation import ActivationPolicy, Candidate, estimate_throughputs, plan_activation

POLICY = ActivationPolicy(margin=0.2, hysteresis=0.15, min_dwell_s=10.0, assumed_samples_per_s=10.0)


def fleet(*specs: tuple[str, float, float], active: set[str] = frozenset(), since_s: float = 0.0) -> list[Candidate]:
    """(id, $/h, samples/s) triples."""
    return [Candidate(wid, price, mu, active=wid in active, state_since_s=since_s) for wid, price, mu in specs]


def test_cheapest_per_throughput_first_until_the_target_with_margin() -> None:
    candidates = fleet(
        ("fast-pricey", 3.0, 30.0),  # 0.100 $/h per sample/s
        ("slow-cheap", 0.5, 10.0),  # 0.050
        ("mid", 1.0, 25.0),  # 0.040: best
        ("worst", 2.0, 10.0),  # 0.200
    )
    plan = plan_activation(candidates, required_samples_per_s=30.0, policy=POLICY, now_s=100.0)
    # target 36: mid (25) + slow-cheap (10) = 35 < 36, so fast-pricey too; never the worst
    assert plan.active_ids == {"mid", "slow-cheap", "fast-pricey"}
    assert plan.standby_ids == {"worst"}
    assert plan.target_samples_per_s == 36.0
    assert plan.planned_samples_per_s == 65.0 and plan.planned_price_per_hour == 4.5


def test_unknown_requirement_activates_everyone_and_free_workers_are_always_active() -> None:
    candidates = fleet(("a", 1.0, 10.0), ("b", 0.0, 5.0), ("c", 2.0, 0.0))
    assert plan_activation(candidates, None, POLICY, 0.0).active_ids == {"a", "b", "c"}
    assert plan_activation(candidates, math.inf, POLICY, 0.0).active_ids == {"a", "b", "c"}
    # the free worker alone covers nothing, but it is active even with a tiny requirement
    plan = plan_activation(candidates, 1.0, POLICY, 0.0)
    assert "b" in plan.active_ids and plan.active_ids == {"b"}


def test_hysteresis_keeps_a_set_inside_the_band_and_measurement_noise_does_not_flap() -> None:
    specs = [("w1", 1.0, 10.0), ("w2", 1.0, 10.0), ("w3", 1.0, 10.0), ("w4", 1.2, 10.0)]
    plan = plan_activation(fleet(*specs), 25.0, POLICY, now_s=0.0)  # target 30: three workers
    active = set(plan.active_ids)
    assert len(active) == 3
    # throughput jitters +-8% around the requirement for many passes: the active set never changes
    for i in range(50):
        jitter = 1 + 0.08 * math.sin(i)
        plan = plan_activation(fleet(*specs, active=active), 25.0 * jitter, POLICY, now_s=100.0 + i)
        assert set(plan.active_ids) == active, (i, plan.reason)


def test_shrinks_only_when_clearly_over_and_only_settled_workers() -> None:
    specs = [("cheap", 1.0, 20.0), ("pricey", 3.0, 20.0)]
    both = {"cheap", "pricey"}
    # the requirement fell to 10 (target 12): cheap alone gives 20 >= 12 * 1.15, so pricey goes ...
    settled = plan_activation(fleet(*specs, active=both, since_s=0.0), 10.0, POLICY, now_s=100.0)
    assert settled.active_ids == {"cheap"} and settled.reason.startswith("shrank")
    # ... but not if it was activated less than min_dwell_s ago
    fresh = plan_activation(fleet(*specs, active=both, since_s=95.0), 10.0, POLICY, now_s=100.0)
    assert fresh.active_ids == both
    # and not when dropping it would leave less than target * (1 + hysteresis)
    tight = plan_activation(fleet(*specs, active=both, since_s=0.0), 18.0, POLICY, now_s=100.0)
    assert tight.active_ids == both


def test_grows_when_below_the_band_and_repicks_when_a_much_cheaper_worker_joins() -> None:
    plan = plan_activation(fleet(("a", 2.0, 10.0), ("b", 2.0, 10.0), active={"a"}), 15.0, POLICY, now_s=50.0)
    assert plan.active_ids == {"a", "b"} and plan.reason.startswith("grew")
    joined = fleet(("a", 2.0, 10.0), ("b", 2.0, 10.0), ("bargain", 0.5, 30.0), active={"a", "b"})
    plan = plan_activation(joined, 15.0, POLICY, now_s=60.0)
    assert plan.active_ids == {"bargain"} and plan.reason.startswith("re-picked")


def test_unmeasured_workers_take_their_gpu_peers_median_then_the_fleet_median_then_the_assumption() -> None:
    candidates = [
        Candidate("a", 1.0, 10.0, gpu_type="L4"),
        Candidate("b", 1.0, 20.0, gpu_type="L4"),
        Candidate("c", 1.0, 40.0, gpu_type="A100"),
        Candidate("new-l4", 1.0, 0.0, gpu_type="L4"),
        Candidate("new-h100", 1.0, 0.0, gpu_type="H100"),
    ]
    estimates = estimate_throughputs(candidates, assumed_samples_per_s=7.0)
    assert estimates["new-l4"] == 15.0  # median of its type
    assert estimates["new-h100"] == 20.0  # median of the measured fleet
    assert estimate_throughputs([Candidate("x", 1.0, 0.0)], 7.0) == {"x": 7.0}


def test_changes_are_relative_to_the_current_set() -> None:
    plan = plan_activation(
        fleet(("a", 1.0, 10.0), ("b", 5.0, 10.0), active={"b"}, since_s=0.0), 5.0, POLICY, now_s=100.0
    )
    to_activate, to_standby = plan.changes({"b"})
    assert (to_activate, to_standby) == ({"a"}, {"b"})  # re-picked: a is five times cheaper


def test_a_lying_workers_huge_rate_counts_at_most_four_times_the_fleets_median() -> None:
    honest = [("h1", 1.0, 10.0), ("h2", 1.0, 12.0), ("h3", 1.0, 8.0)]
    liar = ("liar", 0.5, 1e6)  # claims a million samples/s, cheapest per claimed throughput
    estimates = estimate_throughputs(fleet(*honest, liar), assumed_samples_per_s=7.0)
    assert estimates["liar"] == 4 * 10.0  # the low median of (8, 10, 12, 1e6) is 10
    assert {w: estimates[w] for w, _, _ in honest} == {"h1": 10.0, "h2": 12.0, "h3": 8.0}  # unchanged

    # a requirement of 40 (target 48): the liar alone no longer covers it (it would at 1e6), so honest
    # workers stay active; a liar displaces at most 4x the median of honest throughput
    plan = plan_activation(fleet(*honest, liar), 40.0, POLICY, now_s=100.0)
    assert "liar" in plan.active_ids and len(plan.active_ids) >= 2
    assert plan.planned_samples_per_s <= 10.0 + 12.0 + 8.0 + 40.0
