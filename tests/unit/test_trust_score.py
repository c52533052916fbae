"""The trust score (services/learner/trust.py) on synthetic statistics: honest groups at every lag stay
inside the band and never make a worker suspect; each liar kind crosses the threshold within 50 groups;
a release starts the score over."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from services.learner.trust import TrustTracker
from shared.config import TrustConfig
from shared.messages import QuarantinedWorkers

CONFIG = TrustConfig(band_nats=[0.02, 0.2, 0.3], audit_tolerance_nats=0.01, quarantine_score=10.0)


def honest_group(rng: random.Random, lag: int) -> tuple[float, float | None]:
    """(statistic, exact diff) of an honest group: engine noise at lag 0, the k updates' drift at lag k,
    spread up to 80% of the band; an exact check (lag 0 always, else a quarter audited) sees engine noise."""
    statistic = rng.uniform(0.0, 0.8 * CONFIG.band_nats[min(lag, 2)])
    exact = rng.uniform(0, 1e-5) if lag == 0 or rng.random() < 0.25 else None
    return (rng.uniform(0, 1e-5) if lag == 0 else statistic), exact


def test_honest_workers_at_every_lag_are_never_suspect() -> None:
    tracker, rng = TrustTracker(CONFIG), random.Random(0)
    for _ in range(10_000):
        lag = rng.choice([0, 1, 2])
        statistic, exact = honest_group(rng, lag)
        tracker.observe("honest", lag, statistic, exact)
    trust = tracker.snapshot()["honest"]
    assert not trust.suspect
    assert trust.score == 0.0 and trust.num_suspicious == 0 and trust.num_audit_failures == 0
    assert trust.num_audits > 3000


def test_a_few_honest_outliers_decay_away() -> None:
    tracker = TrustTracker(CONFIG)
    for index in range(2000):
        outlier = index % 20 == 0  # 5% of the groups just outside the band
        tracker.observe("noisy", 1, 0.25 if outlier else 0.05, None)
    assert not tracker.snapshot()["noisy"].suspect


@pytest.mark.parametrize(
    ("name", "statistic", "exact"),
    [
        ("garbage_logprobs", lambda rng, lag: rng.uniform(2.0, 4.0), lambda rng, lag: None),
        # stale weights claimed as new: slightly off the band, and off by far more than engine noise when checked
        ("stale_weights", lambda rng, lag: 0.8 * CONFIG.band_nats[lag], lambda rng, lag: 0.05 if lag == 0 else None),
        ("swapped_text", lambda rng, lag: rng.uniform(1.0, 3.0), lambda rng, lag: None),
    ],
)
def test_each_liar_is_suspect_within_50_groups(
    name: str, statistic: Callable[[random.Random, int], float], exact: Callable[[random.Random, int], float | None]
) -> None:
    tracker, rng = TrustTracker(CONFIG), random.Random(1)
    for _ in range(50):
        lag = rng.choice([0, 1, 2])
        tracker.observe(name, lag, statistic(rng, lag), exact(rng, lag))
        if tracker.snapshot()[name].suspect:
            break
    assert tracker.snapshot()[name].suspect, f"{name} not suspect after 50 groups"


def test_suspect_is_sticky_until_a_release_resets_the_score() -> None:
    tracker = TrustTracker(CONFIG)
    for _ in range(10):
        tracker.observe("w", 0, 1.0, 1.0)
    assert tracker.snapshot()["w"].suspect
    for _ in range(100):
        tracker.observe("w", 1, 0.0, None)
    assert tracker.snapshot()["w"].suspect  # honest-looking groups do not clear it

    released = tracker.apply_releases(QuarantinedWorkers(run_id="r", num_releases={"w": 1}))
    assert released == ["w"]
    trust = tracker.snapshot()["w"]
    assert not trust.suspect and trust.score == 0.0 and trust.num_releases_seen == 1
    assert tracker.apply_releases(QuarantinedWorkers(run_id="r", num_releases={"w": 1})) == []  # seen already


def test_a_worker_first_seen_after_its_release_starts_released() -> None:
    tracker = TrustTracker(CONFIG)
    tracker.apply_releases(QuarantinedWorkers(run_id="r", num_releases={"w": 2}))
    tracker.observe("w", 0, 0.0, 0.0)
    assert tracker.snapshot()["w"].num_releases_seen == 2
