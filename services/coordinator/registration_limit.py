"""Registration rate limits: a token bucket per join credential, and one per source address for the
unauthenticated path, in each coordinator process.

Registering costs Redis writes, a control pass and an ACL user; a flood of registrations, even with a
valid join token, must not grow Redis or starve heartbeats. There is no bucket for everyone: a single one
let one client's flood (7,420 identities in 230 s) answer every honest registration and rejoin with 429.
Each credential draws from its own bucket, so one credential's flood never makes another credential wait:

    credential   `registrations_per_min` of the credential (its budget: services/coordinator/credential_budget.py),
                 in bursts of twice its `max_workers` (every worker of an operator may rejoin at once after an
                 outage, and retry as often)
    address      the unauthenticated path, keyed by the client's address: open registration (dev), and a
                 missing or wrong join token (a 401 costs a hash and a lookup; refusing guesses at a bounded
                 rate keeps it that way). [credentials] registrations_per_min_per_address, same bursts.

An empty bucket answers 429 with Retry-After (seconds until the next registration is admitted), which
the worker's membership loop honours (services/rollout/membership.py). Per process, not shared through
Redis: two coordinators on one Redis admit twice the rate, which is still bounded. At most MAX_BUCKETS
buckets are kept (the least recently used go first: a forgotten bucket is a full one).

An attacker does not honour Retry-After: 192 identities of one credential retrying every second kept the
coordinator answering 429s through FastAPI, its join-token lookups and a thread each. So a join token the
slow path verified is remembered (its sha256, for VERIFIED_TTL_S) with its bucket, and while that bucket is
empty the coordinator's ASGI entry answers its next registration 429 at once (`refuse_early`: a dict lookup
and a sha256, no body read, no Redis); a token not verified lately always takes the slow path.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_BUCKETS = 100_000  # ~200 bytes each: 20 MB at most, however many addresses a flood comes from
VERIFIED_TTL_S = 5.0  # a verified join token is refused early for this long at most (a revocation shows after it)


@dataclass
class _Bucket:
    tokens: float
    at_s: float


@dataclass(frozen=True)
class Rate:
    per_min: float
    burst: int

    def __post_init__(self) -> None:
        if self.per_min <= 0 or self.burst < 1:
            raise ValueError(f"per_min must be > 0 and burst >= 1, got {self.per_min}, {self.burst}")


class RegistrationLimits:
    """Token buckets by key ("credential:<id>", "address:<host>"), each at the rate its caller names."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_buckets: int = MAX_BUCKETS) -> None:
        self.clock = clock
        self.max_buckets = max_buckets
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()  # sync endpoints run in a thread pool
        self.num_refused: dict[str, int] = {}  # by kind ("credential", "address", "early")
        self._verified: OrderedDict[str, tuple[str, Rate, float]] = OrderedDict()  # token sha256 -> key, rate, until

    def take(self, key: str, rate: Rate) -> float | None:
        """Admit one registration under `key` (None), or refuse it: the seconds until one would be admitted."""
        with self._lock:
            now_s = self.clock()
            bucket = self._buckets.pop(key, None) or _Bucket(tokens=float(rate.burst), at_s=now_s)
            self._buckets[key] = bucket  # most recently used last
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
            bucket.tokens = min(float(rate.burst), bucket.tokens + (now_s - bucket.at_s) * rate.per_min / 60)
            bucket.at_s = now_s
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return None
            kind = key.partition(":")[0]
            self.num_refused[kind] = self.num_refused.get(kind, 0) + 1
            return (1.0 - bucket.tokens) * 60 / rate.per_min

    def remember(self, token_sha256: str, key: str, rate: Rate) -> None:
        """A join token the slow path verified, with its bucket: `refuse_early` may answer for it a while."""
        with self._lock:
            self._verified.pop(token_sha256, None)
            self._verified[token_sha256] = (key, rate, self.clock() + VERIFIED_TTL_S)
            while len(self._verified) > self.max_buckets:
                self._verified.popitem(last=False)

    def refuse_early(self, token_sha256: str) -> float | None:
        """The seconds to wait, when `token_sha256` was verified lately and its bucket has nothing to admit now
        (counted as an "early" refusal); None: the slow path decides."""
        with self._lock:
            remembered = self._verified.get(token_sha256)
            if remembered is None:
                return None
            key, rate, until_s = remembered
            now_s = self.clock()
            bucket = self._buckets.get(key)
            if now_s >= until_s or bucket is None:
                return None
            tokens = min(float(rate.burst), bucket.tokens + (now_s - bucket.at_s) * rate.per_min / 60)
            if tokens >= 1.0:
                return None
            self.num_refused["early"] = self.num_refused.get("early", 0) + 1
            return (1.0 - tokens) * 60 / rate.per_min


def credential_key(credential_id: str) -> str:
    return f"credential:{credential_id}"


def address_key(host: str) -> str:
    return f"address:{host}"


def retry_after_header(wait_s: float) -> str:
    """Retry-After takes whole seconds: round up, at least 1."""
    return str(max(1, math.ceil(wait_s)))
