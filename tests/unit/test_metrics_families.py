"""shared/metrics.py and each service's prometheus.py: the families every service exposes are valid Prometheus text, built from typed state."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.rollout.prometheus import BatchOccupancy, SwapPauses, rollout_families
from shared.api import HeartbeatRequest, WeightSwapReport
from shared.messages import FlatGroups, StepDiagnostics
from shared.metrics import CallbackCollector, learner_families, new_registry
from tests.run_records import learner_state


def parse(collector: CallbackCollector) -> dict[str, list]:
    text = generate_latest(new_registry(collector)).decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_learner_metrics_come_from_its_state() -> None:
    state = learner_state(
        learner_version=12,
        num_dropped={"stale": 3},
        num_steps_done=12,
        train_s_total=6.0,
        idle_s_total=1.5,
        wall_s=9.0,
        staleness_histogram={"0": 4, "1": 50, "2": 10},
    )
    metrics = parse(CallbackCollector(lambda: learner_families(state)))
    assert metrics["relayrl_learner_steps"][0].value == 12
    assert metrics["relayrl_learner_idle_seconds"][0].value == 1.5
    assert {s.labels["lag"]: s.value for s in metrics["relayrl_learner_trained_groups"]} == {"0": 4, "1": 50, "2": 10}
    assert metrics["relayrl_learner_dropped_groups"][0].labels == {"reason": "stale"}
    assert parse(CallbackCollector(lambda: learner_families(None))) == {}  # before the first state
    assert metrics["relayrl_learner_zero_variance_warning"][0].value == 0


def test_learner_metrics_show_flat_groups_and_the_zero_variance_warning() -> None:
    flat = FlatGroups(num_groups=10, num_flat_at_zero=8, num_flat_at_max=1, num_skipped=5, num_samples=80)
    state = learner_state(
        last_flat_groups=flat,
        zero_variance_warning="zero reward variance: ...",
    )
    metrics = parse(CallbackCollector(lambda: learner_families(state)))
    assert metrics["relayrl_learner_last_zero_variance_fraction"][0].value == 0.9
    assert {s.labels["reward"]: s.value for s in metrics["relayrl_learner_last_flat_groups"]} == {
        "0": 8,
        "1": 1,
        "other": 0,
    }
    assert metrics["relayrl_learner_last_groups_per_trained_group"][0].value == 2.0
    assert metrics["relayrl_learner_zero_variance_warning"][0].value == 1


def test_every_step_diagnostic_is_a_gauge_named_and_described_by_its_field() -> None:
    """StepDiagnostics is the one definition: each field becomes relayrl_learner_last_<name> with its description
    as help (the importance weights keep their older series names), and none show before the first step."""
    last_step = StepDiagnostics(
        loss=0.25, ratio_mean=1.1, clip_fraction=0.1, truncated_fraction=0.02, approx_kl=0.01, grad_norm=3.0
    )
    state = learner_state(
        last_step=last_step,
    )
    text = generate_latest(new_registry(CallbackCollector(lambda: learner_families(state)))).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    older_names = {"is_weight_mean": "importance_weight_mean", "is_weight_max": "importance_weight_max"}
    for name, field in StepDiagnostics.model_fields.items():
        family = families[f"relayrl_learner_last_{older_names.get(name, name)}"]
        assert field.description and family.documentation == f"last step: {field.description}"
        assert family.samples[0].value == getattr(last_step, name)
    assert families["relayrl_learner_last_ess_fraction"].samples[0].value == 1.0  # on-policy default
    before_a_step = parse(CallbackCollector(lambda: learner_families(state.model_copy(update={"last_step": None}))))
    assert "relayrl_learner_last_loss" not in before_a_step and "relayrl_learner_steps" in before_a_step


def test_rollout_metrics_come_from_the_heartbeat_it_would_send() -> None:
    report = HeartbeatRequest(
        policy_version=3,
        num_groups_done=7,
        samples_per_s=40.0,
        tokens_per_s=90.0,
        group_latency_s=0.2,
        last_swap=WeightSwapReport(policy_version=3, announced_at_s=100.0, swapped_at_s=100.4, num_bytes=10),
    )
    metrics = parse(CallbackCollector(lambda: rollout_families("w-a", report)))
    assert metrics["relayrl_worker_tokens_per_second"][0].value == 90.0
    assert metrics["relayrl_worker_groups"][0].value == 7
    assert abs(metrics["relayrl_worker_broadcast_seconds"][0].value - 0.4) < 1e-9


def test_rollout_metrics_count_every_swap_pause_in_a_histogram() -> None:
    pauses = SwapPauses()
    for pause_s in (0.02, 0.3, 0.3, 45.0):
        pauses.observe(pause_s)
    metrics = parse(CallbackCollector(lambda: rollout_families("w-a", HeartbeatRequest(), pauses)))
    buckets = {
        s.labels["le"]: s.value for s in metrics["relayrl_worker_swap_pause_seconds"] if s.name.endswith("_bucket")
    }
    assert (buckets["0.01"], buckets["0.025"], buckets["0.25"], buckets["0.5"], buckets["30.0"]) == (0, 1, 1, 3, 3)
    assert buckets["+Inf"] == 4
    (total,) = [s.value for s in metrics["relayrl_worker_swap_pause_seconds"] if s.name.endswith("_sum")]
    assert abs(total - 45.62) < 1e-9


def test_a_continuous_swap_is_one_pause_its_load_and_the_recompute_after_it() -> None:
    pauses = SwapPauses()
    pauses.extend_last(0.004)  # a recompute before any swap observed: a pause of its own
    pauses.observe(0.02)  # a load
    pauses.extend_last(0.1)  # the next step recomputes the rows in flight: the same swap's pause goes on
    metrics = parse(CallbackCollector(lambda: rollout_families("w-a", HeartbeatRequest(), pauses)))
    series = metrics["relayrl_worker_swap_pause_seconds"]
    buckets = {s.labels["le"]: s.value for s in series if s.name.endswith("_bucket")}
    assert (buckets["0.01"], buckets["0.025"], buckets["0.1"], buckets["0.25"], buckets["+Inf"]) == (1, 1, 1, 2, 2)
    (total,) = [s.value for s in series if s.name.endswith("_sum")]
    assert abs(total - 0.124) < 1e-9
    assert abs(metrics["relayrl_worker_swap_pause_max_seconds"][0].value - 0.12) < 1e-9


def test_occupancy_is_tokens_decoded_over_row_places_times_steps() -> None:
    occupancy = BatchOccupancy()
    metrics = parse(CallbackCollector(lambda: rollout_families("w-a", HeartbeatRequest(), None, occupancy)))
    assert "relayrl_worker_batch_occupancy" not in metrics  # nothing decoded yet: no ratio
    occupancy.observe(num_tokens=30, num_places=4 * 10)  # a call of 4 places whose longest sample took 10 steps
    occupancy.observe(num_tokens=3, num_places=4)  # a continuous step with 3 of 4 rows running
    metrics = parse(CallbackCollector(lambda: rollout_families("w-a", HeartbeatRequest(), None, occupancy)))
    assert metrics["relayrl_worker_decoded_tokens"][0].value == 33
    assert metrics["relayrl_worker_batch_places"][0].value == 44
    assert metrics["relayrl_worker_batch_occupancy"][0].value == 0.75


def test_a_failing_scrape_leaves_series_out_instead_of_failing_the_service() -> None:
    def broken() -> list:
        raise ConnectionError("redis is down")

    assert parse(CallbackCollector(broken)) == {}
