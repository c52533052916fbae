"""A join credential's record: what all its identities did together, and the control loop's upkeep of it.

Identities are free (one credential registers as many as its budget allows), so what one did must follow the
credential, or a fresh identity starts clean. The work API's scripts keep each credential's record in
RunKeys.credential_work (services/coordinator/work_scripts.py): its leases and how they ended, its groups
the reward service scored and refused, what it has earned (`allowance`) and holds (`held`). Each control
pass (`CredentialBooks.upkeep`):

    fold        the groups the reward service judged of every live identity reach its allowance and its
                credential's record (a lease call does it for its caller; this catches the rest)
    reconcile   each credential's `held` and the speculative set are recounted from XPENDING
    share       each live credential's part of the in-flight window by verified throughput: SHARE_SLACK x
                window x (its scored groups per second / everyone's), at least an equal split of the window. A
                credential holds no more than its share (the lease script), so one that earned a large
                allowance and turns to hoarding cannot take the window from the others. Set only while two
                credentials or more have scored recently; the slack leaves room for one whose workers hold a
                batch each while they generate (a share is not a reservation).
    flag        a credential's record since an admin last released it (all its identities together) against
                the fleet's median identity: the completion comparison of services/coordinator/work_flags.py.
                Quarantine acts on it ([work] quarantine_incomplete, once quarantine_min_ended_leases of its
                leases are judged): services/coordinator/quarantine.py.

The shared join token (credential id "") has a record too (it bounds what its holders hold together), but is
never flagged: every holder of it is one credential, and flagging it would stop the whole fleet of a local
cluster (services/coordinator/join.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis
from redis.typing import EncodableT

from services.coordinator.work_flags import outliers_against, since_release
from services.coordinator.work_leases import WorkLeases
from services.coordinator.work_scripts import INITIAL_ALLOWANCE
from shared.api import CredentialRecord, WorkerInfo
from shared.bus import redis_text
from shared.keys import RunKeys
from shared.work_api import WorkCounts
from shared.work_counts import COUNTERS, JUDGED, parse_counts, release_baseline

SHARE_SLACK = 1.5
RATE_TIME_CONSTANT_S = 10.0  # the verified rate is an exponential average over about this long
RECORD_FIELDS = (*COUNTERS, *JUDGED)  # a credential's record: the work counters of its identities, and their judged


@dataclass
class _Rate:
    scored: int
    at_s: float
    per_s: float = 0.0


@dataclass
class CredentialBooks:
    """Per-credential records of one run. `window`: the groups kept in flight ([data] max_groups_in_flight)
    until the task feed writes the window in force (RunKeys.feed_window: wider under dynamic sampling)."""

    redis: redis.Redis
    keys: RunKeys
    work: WorkLeases
    window: int
    _rates: dict[str, _Rate] = field(default_factory=dict)

    # reading
    def record(self, credential_id: str) -> CredentialRecord:
        return self.records([credential_id])[credential_id]

    def records(self, credential_ids: Iterable[str]) -> dict[str, CredentialRecord]:
        ids = list(dict.fromkeys(credential_ids))
        with self.redis.pipeline(transaction=False) as pipe:
            for credential_id in ids:
                pipe.hgetall(self.keys.credential_work(credential_id))
            raws = pipe.execute()
        initial = INITIAL_ALLOWANCE if self.work.config.earn_leases else self.work.credentials.max_leases
        return {
            credential_id: _record(raw, self.keys.credential_work(credential_id), initial)
            for credential_id, raw in zip(ids, raws, strict=True)
        }

    def counts_since_release(self, credential_ids: Iterable[str]) -> dict[str, WorkCounts]:
        """Each credential's record as work counts, over the leases ended since an admin last released it."""
        ids = list(dict.fromkeys(credential_ids))
        records = self.records(ids)
        with self.redis.pipeline(transaction=False) as pipe:
            for credential_id in ids:
                pipe.hgetall(self.keys.credential_release_baseline(credential_id))
            baselines = pipe.execute()
        return {
            credential_id: since_release(
                records[credential_id], release_baseline(raw, self.keys.credential_release_baseline(credential_id))
            )
            for credential_id, raw in zip(ids, baselines, strict=True)
        }

    # writing
    def mark_released(self, credential_id: str) -> None:
        """An admin released the credential: its record is judged from now on (it stays as it is)."""
        counts = self.record(credential_id)
        fields: dict[EncodableT, EncodableT] = {name: getattr(counts, name) for name in RECORD_FIELDS}
        key = self.keys.credential_release_baseline(credential_id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=fields)
            pipe.execute()

    # the control loop's upkeep (module doc)
    def upkeep(self, live: list[WorkerInfo], now_s: float) -> None:
        credentials = sorted({w.operator_id for w in live})
        self.work.fold([w.worker_id for w in live])
        self.work.reconcile(sorted(set(credentials) | set(self._rates)))
        self.set_shares(credentials, now_s)

    def set_shares(self, credentials: list[str], now_s: float) -> dict[str, int]:
        """Measure each live credential's verified rate and write its share (module doc); returns the shares."""
        records = self.records(credentials)
        for credential_id in credentials:
            self._observe(credential_id, records[credential_id].scored, now_s)
        for gone in set(self._rates) - set(credentials):
            del self._rates[gone]
        rates = {credential_id: self._rates[credential_id].per_s for credential_id in credentials}
        total = sum(rates.values())
        shares: dict[str, int] = {}
        if len(credentials) >= 2 and total > 0:
            window = self.window_now()
            # at least an equal split: a new credential ramps up as fast as it earns, not as its rate's average does
            floor = max(INITIAL_ALLOWANCE, math.ceil(window / len(credentials)))
            shares = {c: max(floor, math.ceil(SHARE_SLACK * window * rate / total)) for c, rate in rates.items()}
        with self.redis.pipeline(transaction=False) as pipe:
            for credential_id in credentials:
                key = self.keys.credential_work(credential_id)
                if credential_id in shares:
                    pipe.hset(key, "share", shares[credential_id])
                else:
                    pipe.hdel(key, "share")
            pipe.execute()
        return shares

    def window_now(self) -> int:
        """The task feed's window in force, else the run's."""
        written = self.redis.get(self.keys.feed_window)
        return int(written) if written is not None else self.window

    def flags(self, credential_ids: Iterable[str], median: float | None) -> dict[str, str]:
        """Issued credentials whose record since their last release departs from the fleet's `median` identity
        (None: no fleet to compare with): credential id -> why."""
        issued = [credential_id for credential_id in credential_ids if credential_id]
        if median is None or not issued:
            return {}
        return outliers_against(self.counts_since_release(issued), median)

    def _observe(self, credential_id: str, scored: int, now_s: float) -> None:
        rate = self._rates.get(credential_id)
        if rate is None:
            self._rates[credential_id] = _Rate(scored=scored, at_s=now_s)
            return
        elapsed_s = now_s - rate.at_s
        if elapsed_s <= 0:
            return
        weight = 1.0 - math.exp(-elapsed_s / RATE_TIME_CONSTANT_S)
        rate.per_s += weight * (max(0, scored - rate.scored) / elapsed_s - rate.per_s)
        rate.scored, rate.at_s = scored, now_s


def _record(raw: dict[bytes, bytes], key: str, initial_allowance: int) -> CredentialRecord:
    """A credential's stored record: its counts (one that is not a count reads as 0), the allowance it earned
    (`initial_allowance` until it earned any) and its share, when the control loop set one."""
    counts = parse_counts(raw, key, names=(*RECORD_FIELDS, "held", "share"))
    share = counts.pop("share", 0) if b"share" in raw else None
    return CredentialRecord(**counts, allowance=_allowance(raw.get(b"allowance"), initial_allowance), share=share)


def _allowance(value: bytes | None, initial_allowance: int) -> float:
    """The stored allowance (a number >= 0, not necessarily whole); `initial_allowance` when none or not a number."""
    try:
        allowance = float(redis_text(value)) if value is not None else initial_allowance
    except ValueError:
        allowance = initial_allowance
    return max(0.0, allowance if math.isfinite(allowance) else initial_allowance)
