"""413 for a request body over the coordinator's limit, before anything parses it.

Every body the coordinator accepts is a few hundred bytes; a client sending megabytes (two 10 MiB
requests once blocked the event loop ~5 s, long enough for every worker's lease to run out) is refused
by its Content-Length at once, or, when it streams a body without one, as soon as the bytes received
pass the limit: the application then reads a disconnect and nothing it sends goes out. A large body a route
does take (the work API's submissions, up to 16 MiB) is held by `received_body`, in a mapping of its own.
"""

from __future__ import annotations

import contextlib
import json
import mmap
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_REQUEST_BODY_BYTES = 64 * 1024


class BodyLimit:
    """An ASGI layer in front of `app` that refuses bodies over `max_bytes` with 413."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_REQUEST_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is None or declared > self.max_bytes:
            await self.refuse(send, "Content-Length is not a number" if declared is None else None)
            return
        received = 0
        refused = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = True
                    await self.refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def refuse(self, send: Send, reason: str | None = None) -> None:
        status = 400 if reason else 413
        detail = reason or f"request body over {self.max_bytes} bytes"
        payload = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers + [(b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length (0 when it sends none); None when the header is not a number."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return 0


@contextlib.asynccontextmanager
async def received_body(request: Request, max_bytes: int) -> AsyncIterator[memoryview]:
    """The request's body (at most `max_bytes`, which the BodyLimit in front has enforced), as a view of an
    anonymous memory mapping of its own, unmapped when the block ends. Starlette's `request.body()` keeps the
    chunks, then their join (twice the body at its peak), cached until the request ends, and the allocator
    keeps what such buffers took: 4 senders repeating a 16 MiB body for 5 s grew the coordinator by ~2 GiB of
    RSS that way, by 61 MiB (their 4 bodies) this way. A mapping's untouched pages cost nothing, and
    unmapping gives every page back."""
    mapping = mmap.mmap(-1, max(1, max_bytes))
    try:
        num_bytes = 0
        async for chunk in request.stream():
            mapping[num_bytes : num_bytes + len(chunk)] = chunk  # IndexError past max_bytes: a bug in front
            num_bytes += len(chunk)
        with memoryview(mapping) as view, view[:num_bytes] as body:
            yield body
    finally:
        mapping.close()  # BufferError if a view of it outlived the block: a bug
