"""The simulator's continuous mode (simulator/continuous.py) against its batch mode on the same fleet: with
long-tailed sample lengths a batch call lasts as long as its longest sample, so continuous batching feeds
the learner more groups per second; with equal lengths the two modes agree; no task is ever lost."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.engine import SimConfig, simulate
from simulator.fleet import WorkerSpec

# geometric lengths (EOS once in ~15 tokens, as the demo's random policy), as multiples of their mean
GEOMETRIC = tuple(k / 15.0 for k in range(1, 121) for _ in range(round(1000 * (14 / 15) ** (k - 1) / 15)))


RULES = ("oldest_token", "per_token")


def fleet(num: int, samples_per_s: float) -> list[WorkerSpec]:
    return [WorkerSpec(f"w{i}", "cpu", 0.0, samples_per_s, 1000.0, 0.0, math.inf) for i in range(num)]


def config(**overrides: object) -> SimConfig:
    base = SimConfig(
        group_size=8,
        groups_per_step=32,
        num_steps=60,
        train_s=0.2,
        staleness_bound=2,
        max_groups_per_batch=8,
        fixed_broadcast_s=0.1,
        scoring_s=0.01,
        length_factors=GEOMETRIC,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_continuous_batching_feeds_a_generation_bound_learner_faster_with_long_tailed_lengths() -> None:
    batch = simulate(config(), fleet(4, 200.0))
    continuous = simulate(config(batching="continuous"), fleet(4, 200.0))
    assert batch.num_steps == continuous.num_steps == 60
    # a batch call waits for its longest sample (several times the mean): the learner waits with it
    assert continuous.wall_s < 0.8 * batch.wall_s
    assert continuous.utilization > batch.utilization


def test_with_equal_lengths_the_modes_agree() -> None:
    uniform = config(length_factors=(), max_groups_per_batch=1)
    batch = simulate(uniform, fleet(4, 200.0))
    continuous = simulate(dataclasses.replace(uniform, batching="continuous"), fleet(4, 200.0))
    assert continuous.wall_s == pytest.approx(batch.wall_s, rel=0.1)


def test_no_task_is_lost_when_continuous_workers_fail() -> None:
    workers = [
        dataclasses.replace(spec, fails_after_s=0.5 + index) if index < 2 else spec
        for index, spec in enumerate(fleet(4, 200.0))
    ]
    from simulator.continuous import ContinuousSimulation

    simulation = ContinuousSimulation(config(batching="continuous", claim_idle_s=0.5), workers)
    result = simulation.run()
    assert result.num_failures == 2 and result.num_steps == 60
    assert simulation.groups_in_flight() == simulation.config.groups_in_flight


def test_tokens_are_never_older_than_their_group_and_batch_tokens_share_their_groups_lag() -> None:
    batch = simulate(config(), fleet(4, 200.0))
    continuous = simulate(config(batching="continuous"), fleet(4, 200.0))
    for result in (batch, continuous):
        assert sum(result.token_lag_histogram.values()) == pytest.approx(1.0)
        assert result.num_trained_groups == 60 * 32
        assert sum(result.worker_groups.values()) >= result.num_trained_groups + result.num_dropped_stale
    num_groups = sum(batch.staleness_histogram.values())
    assert batch.token_lag_histogram == pytest.approx(
        {lag: n / num_groups for lag, n in batch.staleness_histogram.items()}
    )

    def mean_lag(histogram: dict[int, float]) -> float:
        total = sum(histogram.values())
        return sum(lag * weight for lag, weight in histogram.items()) / total

    # a group's version is its oldest token's: new weights land while its rows run, so its tokens are younger
    assert mean_lag(continuous.token_lag_histogram) < mean_lag(continuous.staleness_histogram)


def test_at_s1_groups_leased_in_the_broadcast_gap_make_the_extra_stale_drops() -> None:
    """The learner frees slots when it reads the groups that arrived while it trained; a continuous worker
    leases them at once with the version it holds, one behind until the new one lands T_bcast later. Their
    groups start at lag 1, so at S = 1 they must be read within the same step or be dropped. Waiting for
    the published version before leasing removes the extra drops."""
    s1 = config(staleness_bound=1)
    batch = simulate(s1, fleet(4, 200.0))
    continuous = simulate(dataclasses.replace(s1, batching="continuous"), fleet(4, 200.0))
    newest_only = simulate(dataclasses.replace(s1, batching="continuous", lease_newest_only=True), fleet(4, 200.0))
    assert continuous.num_dropped_stale > 1.5 * batch.num_dropped_stale
    assert newest_only.num_dropped_stale < batch.num_dropped_stale
    assert newest_only.wall_s < continuous.wall_s


def test_continuous_max_rows_sets_a_workers_rows() -> None:
    from simulator.continuous import ContinuousSimulation

    simulation = ContinuousSimulation(config(batching="continuous", continuous_max_rows=12), fleet(2, 200.0))
    assert simulation.max_rows == 12
    assert simulation.run().num_steps == 60


def test_per_token_admission_keeps_the_groups_whose_newer_tokens_are_within_the_bound() -> None:
    """At S = 1 the oldest-token rule drops long-tailed groups whose later rows are fresh; per-token
    admission (a group is trained while its newest token is within S) keeps most of them."""
    s1 = dataclasses.replace(config(staleness_bound=1), batching="continuous")
    oldest = simulate(s1, fleet(4, 200.0))
    per_token = simulate(dataclasses.replace(s1, admission="per_token"), fleet(4, 200.0))
    assert oldest.num_dropped_stale > 0
    assert per_token.num_dropped_stale < oldest.num_dropped_stale / 2
    assert max(per_token.token_lag_histogram) <= 1  # tokens older than S are masked, not trained
    assert per_token.dropped_token_fraction > 0
    batch, batch_per_token = (simulate(config(staleness_bound=1, admission=rule), fleet(4, 200.0)) for rule in RULES)
    assert (batch.num_dropped_stale, batch.wall_s) == (batch_per_token.num_dropped_stale, batch_per_token.wall_s)
