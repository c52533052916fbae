"""413 for a request body over the coordinator's limit, before anything parses it.

Every body the coordinator accepts is a few hundred bytes; a client sending megabytes (two 10 MiB
requests once blocked the event loop ~5 s, long enough for every worker's lease to run out) is refused
by its Content-Length at once, or, when it streams a body without one, as soon as the bytes received
pass the limit: the application then reads a disconnect and nothing it sends goes out.
"""

from __future__ import annotations

import json

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
