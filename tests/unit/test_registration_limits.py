"""Registration buckets (services/coordinator/registration_limit.py): one per credential and one per address,
each refilling at its own rate; a flood drains only its own; the least recently used are forgotten past the
bound (a forgotten bucket is a full one)."""

from __future__ import annotations

import pytest

from services.coordinator.registration_limit import (
    VERIFIED_TTL_S,
    Rate,
    RegistrationLimits,
    address_key,
    credential_key,
)
from tests.manual_clock import ManualClock

RATE = Rate(per_min=60, burst=3)  # one a second, three at once


def test_a_bucket_admits_its_burst_then_one_per_refill_and_says_how_long_to_wait() -> None:
    clock = ManualClock(0.0)
    limits = RegistrationLimits(clock=clock)
    key = credential_key("op-a")

    assert [limits.take(key, RATE) for _ in range(3)] == [None, None, None]
    assert limits.take(key, RATE) == pytest.approx(1.0)
    clock.advance(0.5)
    assert limits.take(key, RATE) == pytest.approx(0.5)
    clock.advance(0.5)
    assert limits.take(key, RATE) is None
    assert limits.num_refused == {"credential": 2}


def test_one_keys_flood_leaves_every_other_bucket_full() -> None:
    limits = RegistrationLimits(clock=ManualClock(0.0))
    for _ in range(100):
        limits.take(credential_key("op-flood"), RATE)

    assert limits.take(credential_key("op-other"), RATE) is None
    assert limits.take(credential_key(""), RATE) is None  # the shared token is a credential of its own
    assert limits.take(address_key("10.0.0.1"), RATE) is None
    assert limits.num_refused == {"credential": 97}


def test_past_the_bound_the_least_recently_used_bucket_is_forgotten() -> None:
    limits = RegistrationLimits(clock=ManualClock(0.0), max_buckets=2)
    for _ in range(3):
        limits.take(address_key("a"), RATE)
    limits.take(address_key("b"), RATE)
    limits.take(address_key("c"), RATE)  # "a" was used least recently: forgotten

    assert limits.take(address_key("a"), RATE) is None  # full again
    assert limits.take(address_key("c"), RATE) is None  # kept: two of three left


def test_a_rate_needs_a_positive_rate_and_a_burst() -> None:
    with pytest.raises(ValueError):
        Rate(per_min=0, burst=1)
    with pytest.raises(ValueError):
        Rate(per_min=1, burst=0)


def test_a_verified_token_whose_bucket_is_empty_is_refused_early_until_it_refills_or_is_forgotten() -> None:
    clock = ManualClock(0.0)
    limits = RegistrationLimits(clock=clock)
    key = credential_key("op-flood")
    assert limits.refuse_early("sha-of-its-token") is None  # never verified: the slow path decides
    limits.remember("sha-of-its-token", key, RATE)
    assert limits.refuse_early("sha-of-its-token") is None  # its bucket is full
    for _ in range(3):
        limits.take(key, RATE)

    assert limits.refuse_early("sha-of-its-token") == pytest.approx(1.0)
    assert limits.refuse_early("sha-of-another") is None
    clock.advance(1.0)
    assert limits.refuse_early("sha-of-its-token") is None  # one registration's worth refilled
    limits.take(key, RATE)
    clock.advance(VERIFIED_TTL_S)
    assert limits.refuse_early("sha-of-its-token") is None  # forgotten: a revocation or a new budget shows
    assert limits.num_refused == {"early": 1}
