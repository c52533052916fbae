"""The coordinator's connection limits: what any client that reaches its port (every worker, and anyone
else on a public deployment) can hold of it.

    max_connections      connections (or requests in progress) at once; past it uvicorn answers 503 to
                         new requests (its `limit_concurrency`), so memory per client stays bounded
    request_timeout_s    from a connection's opening (or its previous response) until the whole request,
                         head and body, has arrived; a connection that sends nothing, or dribbles its
                         request in, is closed then. Uvicorn itself has no such timeout: it arms one only
                         after a response (keep-alive), so this protocol class adds it.
    keep_alive_s         an idle connection after a response is closed this long after it (uvicorn's
                         `timeout_keep_alive`)

A request that has fully arrived is never cut by these: a long-poll waits its own time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def uvicorn_limits(*, max_connections: int, request_timeout_s: float, keep_alive_s: float) -> dict[str, Any]:
    """Keyword arguments of uvicorn.run / uvicorn.Config that impose these limits."""
    return {
        "http": request_deadline_protocol(request_timeout_s),
        "limit_concurrency": max_connections,
        "timeout_keep_alive": keep_alive_s,
    }


def request_deadline_protocol(request_timeout_s: float) -> type[asyncio.Protocol]:
    """Uvicorn's httptools protocol, with a deadline for each request to arrive whole."""
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s}")

    class RequestDeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_complete(self) -> None:
            self._disarm()  # the request is all here: from now on the application takes its time
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request on this connection must arrive in time as well

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(request_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            in_progress = self.cycle is not None and not self.cycle.response_complete and not self.cycle.more_body
            if not in_progress and not self.transport.is_closing():
                self.transport.close()

    return RequestDeadlineProtocol
