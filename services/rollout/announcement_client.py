"""Where a worker learns that the learner published a version: one protocol, two sources.

    HttpAnnouncements     the coordinator's GET /v1/weights/latest (a long poll, the worker's bearer
                          token): what rollout workers use, since they hold no Redis credentials
    StreamAnnouncements   the WEIGHTS stream itself (XREVRANGE, XREAD BLOCK): for trusted services,
                          tests and tools that have Redis

Both answer the newest announcement that decodes (garbage entries on the stream are skipped), and "news"
means the same for both (shared.api.is_news). An outage raises an error `is_announcement_outage` accepts,
which a caller retries with backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import httpx
from pydantic import ValidationError

from services.rollout.coordinator_client import (
    CoordinatorRejectedError,
    CoordinatorUnavailableError,
    TokenRefusedError,
    transport_error,
)
from shared.api import MAX_WEIGHTS_WAIT_S, WEIGHTS_LATEST_PATH, is_news
from shared.bus import StreamBus
from shared.messages import WeightsPublished
from shared.retry import is_redis_outage
from shared.streams import WEIGHTS
from shared.tls import Verify

log = logging.getLogger(__name__)

NUM_SCANNED = 16  # stream entries looked at for the newest decodable one (as the coordinator's feed)
MAX_BLOCK_MS = 5000  # one XREAD BLOCK (well below shared.bus.connect's 30 s socket timeout)


class AnnouncementSource(Protocol):
    def latest(self) -> WeightsPublished | None:
        """The newest announcement, None if there is none yet."""
        ...

    def wait_newer(
        self, after_version: int, timeout_s: float, *, after_sha256: str | None = None
    ) -> WeightsPublished | None:
        """The newest announcement once it is news to a reader holding (`after_version`, `after_sha256`)
        (shared.api.is_news), waiting at most `timeout_s`; None if none came."""
        ...

    def close(self) -> None: ...


def is_announcement_outage(exc: BaseException) -> bool:
    """Whether a caller of an AnnouncementSource retries `exc` with backoff: the coordinator or Redis is
    out (shared/retry.py: unreachable, loading its data, full)."""
    return isinstance(exc, CoordinatorUnavailableError) or is_redis_outage(exc)


class HttpAnnouncements:
    """Announcements as the coordinator relays them. `token()`: the worker's current bearer token (it
    changes when the worker registers again)."""

    def __init__(
        self,
        coordinator_url: str,
        token: Callable[[], str],
        *,
        connect_timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        verify: Verify = True,
    ) -> None:
        self.base_url = coordinator_url.rstrip("/")
        self.token = token
        # a read may take the whole long poll, plus the answer's way back
        timeout = httpx.Timeout(connect_timeout_s, read=MAX_WEIGHTS_WAIT_S + connect_timeout_s)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, verify=verify)

    def latest(self) -> WeightsPublished | None:
        return self._get(after_version=-1, after_sha256=None, wait_s=0.0)

    def wait_newer(
        self, after_version: int, timeout_s: float, *, after_sha256: str | None = None
    ) -> WeightsPublished | None:
        return self._get(after_version, after_sha256, min(max(timeout_s, 0.0), MAX_WEIGHTS_WAIT_S))

    def close(self) -> None:
        self._http.close()

    def _get(self, after_version: int, after_sha256: str | None, wait_s: float) -> WeightsPublished | None:
        params: dict[str, str | int | float] = {"after_version": after_version, "wait_s": wait_s}
        if after_sha256 is not None:
            params["after_sha256"] = after_sha256
        what = f"GET {self.base_url}{WEIGHTS_LATEST_PATH}"
        try:
            response = self._http.get(
                WEIGHTS_LATEST_PATH, params=params, headers={"Authorization": f"Bearer {self.token()}"}
            )
        except httpx.HTTPError as exc:  # transient, unless the certificate failed verification
            raise transport_error(what, exc) from exc
        if response.status_code == 204:
            return None
        if response.status_code == 200:
            try:
                return WeightsPublished.model_validate_json(response.content)
            except ValidationError as exc:
                raise CoordinatorRejectedError(f"{what}: unreadable announcement: {exc}") from exc
        reason = f"{what}: HTTP {response.status_code}: {response.text[:200]}"
        if response.status_code == 401:
            raise TokenRefusedError(reason)
        if response.status_code >= 500:
            raise CoordinatorUnavailableError(reason)
        raise CoordinatorRejectedError(reason)


class StreamAnnouncements:
    """Announcements read from the run's WEIGHTS stream (`bus` needs read access to it)."""

    def __init__(self, bus: StreamBus) -> None:
        self.bus = bus

    def latest(self) -> WeightsPublished | None:
        return self._newest()[0]

    def wait_newer(
        self, after_version: int, timeout_s: float, *, after_sha256: str | None = None
    ) -> WeightsPublished | None:
        deadline_s = time.monotonic() + timeout_s
        while True:
            newest, newest_id = self._newest()
            if newest is not None and is_news(newest, after_version, after_sha256):
                return newest
            remaining_ms = int((deadline_s - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return None
            self.bus.wait_for_entries(WEIGHTS, after_id=newest_id, block_ms=min(remaining_ms, MAX_BLOCK_MS))

    def close(self) -> None:
        """Nothing to close: the bus is the caller's."""

    def _newest(self) -> tuple[WeightsPublished | None, str]:
        """The newest decodable announcement of this run (None: none) and the newest entry's id ("0-0": none)."""
        messages, num_undecodable, newest_id = self.bus.newest(WEIGHTS, NUM_SCANNED)
        ours = [message for message in messages if message.run_id == self.bus.keys.run_id]
        if num_undecodable or len(ours) < len(messages):
            log.warning(
                "skipped %d undecodable or foreign entries on %s",
                num_undecodable + len(messages) - len(ours),
                self.bus.keys.name_of(WEIGHTS),
            )
        return (ours[0] if ours else None), newest_id
