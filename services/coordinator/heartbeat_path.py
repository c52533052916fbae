"""The heartbeat's hot path: a small ASGI layer in front of FastAPI that serves a worker's heartbeat with
its own token on the event loop, in one entry of a shared Redis call, without FastAPI's middleware,
routing and dependency machinery (which alone cost more CPU per request than everything below, on a
2-core machine serving 1000 workers that beat once a second next to Redis and the load generator;
benchmarks/load_heartbeat.py).

How a heartbeat is served, step by step (files under services/coordinator/):

    1. ASGI entry           app.py: CoordinatorAPI.__call__
       every HTTP request comes to HeartbeatFastPath.__call__ (here) first
    2. is it ours?          here: own_heartbeat
       POST /v1/workers/<id>/heartbeat with "Authorization: Bearer <id>.<secret>" naming the URL's worker;
       anything else goes on to FastAPI untouched (F)
    3. parse and validate   here: read_body, HeartbeatRequest.model_validate_json (shared/api.py)
       at most MAX_BODY_BYTES; a bad body goes to FastAPI (F), which names the field (422)
    4. token digest         here: serve, auth.py: token_sha256
       the digest of the token (the script compares it), the new lease expiry (the registry's clock +
       lease_s) and the record fields to store (worker_registry.py: heartbeat_fields)
    5. batcher              heartbeat_batch.py: HeartbeatBatcher.submit, redis_script.py: ScriptConnection.call
       the entry queues; one flush task sends what queued (up to MAX_BATCH entries) as one EVALSHA on a
       bare asyncio connection whose reply hiredis parses
    6. the Lua script       heartbeat_batch.py: HEARTBEAT_LUA
       per entry, atomically: the digest against the stored one, the lease (ran out -> dead, else
       extended), the fields, and a weight swap reported for the first time recorded for T_bcast;
       an outcome other than OK (unknown, wrong token, dead) goes to FastAPI (F), which says which
    7. T_bcast              here: serve, broadcast_times.py: BroadcastTimes.complete_pending
       a swap that is news completes the versions it can, in a thread, in a fleet of at most
       INLINE_COMPLETION_MAX_WORKERS; in a larger one the control loop does it once a pass
       (control.py: ControlPlane.complete_broadcasts)
    8. response             here: serve, control.py: ControlPlane.learner_view
       200 with the state the script read and the learner's version as of the control loop's last
       pass; a Redis outage (unreachable, loading its data, full) -> 503 with Retry-After, as errors.py
       answers everywhere else

    F. FastAPI fallback     here: replay, app.py: CoordinatorAPI.serve_with_fastapi, routers/workers.py: heartbeat
       the body already read is replayed to FastAPI, whose endpoint answers exactly as without this
       layer: deps.py get_caller (401), the body (422), ensure_known (404), ensure_is_worker (403),
       then worker_registry.py WorkerRegistry.extend_lease runs the same script for one entry through
       redis-py (errors.py: a dead worker -> 410)

The script compares sha256 digests, never tokens: a timing difference could reveal leading bytes of a
digest, and no one can choose a token whose digest starts with given bytes, so this is as safe as the
constant-time compare in auth.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import redis
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from services.coordinator.auth import TOKEN_SEPARATOR, token_sha256
from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.errors import REDIS_RETRY_AFTER_S, redis_outage_detail
from services.coordinator.heartbeat_batch import OK, HeartbeatBatcher, HeartbeatEntry
from services.coordinator.worker_registry import heartbeat_fields
from shared.api import HeartbeatRequest, HeartbeatResponse, WorkerState
from shared.retry import is_redis_outage

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = re.compile(r"^/v1/workers/([A-Za-z0-9_.-]{1,64})/heartbeat$")
MAX_BODY_BYTES = 64 * 1024
INLINE_COMPLETION_MAX_WORKERS = 64


class HeartbeatFastPath:
    """An ASGI layer in front of `app`; `state.coordinator` and `state.control` are read per request."""

    def __init__(self, app: ASGIApp, sync_client: redis.Redis, state: Any) -> None:
        self.app = app
        self.state = state  # the FastAPI app's state: coordinator, control
        self.sync_client = sync_client  # where to connect: the batcher dials the same Redis
        self._batcher: HeartbeatBatcher | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        worker_id, token = self.own_heartbeat(scope)
        if worker_id is None:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is not None and len(body) <= MAX_BODY_BYTES:
            try:
                request = HeartbeatRequest.model_validate_json(body)
            except ValidationError:
                request = None
            try:
                if request is not None and await self.serve(worker_id, token, request, send):
                    return
            except redis.RedisError as exc:  # the boundary policy of services/coordinator/errors.py
                if not is_redis_outage(exc):
                    raise
                detail = json.dumps({"detail": redis_outage_detail(exc)}).encode()
                await send_json(send, 503, detail, [(b"retry-after", str(REDIS_RETRY_AFTER_S).encode())])
                return
        await self.app(scope, replay(body or b"", receive), send)  # FastAPI answers with the reason

    @staticmethod
    def own_heartbeat(scope: Scope) -> tuple[str | None, str]:
        """(worker id, token) when this is a heartbeat carrying the worker's own token, else (None, "")."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None, ""
        match = PATH.match(scope["path"])
        if match is None:
            return None, ""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                claimed, separator, _ = token.partition(TOKEN_SEPARATOR)
                if scheme.lower() == "bearer" and separator and claimed == match.group(1):
                    return match.group(1), token
        return None, ""

    async def serve(self, worker_id: str, token: str, request: HeartbeatRequest, send: Send) -> bool:
        """Answer 200, or return False to leave the answer to FastAPI (not ours to decide)."""
        coordinator = self.state.coordinator
        now_s = coordinator.registry.clock()
        expiry_s = now_s + coordinator.registry.lease_s
        outcome = await self.batcher().submit(
            HeartbeatEntry(
                worker_id=worker_id,
                token_sha256=token_sha256(token),
                now_s=now_s,
                expiry_s=expiry_s,
                fields=heartbeat_fields(request, now_s),
                swap=request.last_swap,
            )
        )
        if outcome.code != OK:
            return False  # unknown, wrong token or dead: the general path says which
        if outcome.swap_ignored is not None:  # a version never announced, or a swap time out of bounds
            coordinator.registry.ignored_swaps.count(outcome.swap_ignored)
        if outcome.swap_is_news:  # the script recorded it; completing a version reads every worker: O(N) per
            # report, O(N^2) per version. A small fleet completes at once; past INLINE_COMPLETION_MAX_WORKERS
            # the control loop completes versions, once a pass, and the heartbeat answers without waiting.
            snapshot = self.state.control.snapshot
            if snapshot is None or len(snapshot.workers) <= INLINE_COMPLETION_MAX_WORKERS:
                times, registry = BroadcastTimes(coordinator.redis, coordinator.keys), coordinator.registry
                await run_in_threadpool(lambda: times.complete_pending(registry.list_live()))
        learner = self.state.control.learner_view()
        answer = HeartbeatResponse(
            state=WorkerState(outcome.state),
            lease_expires_at_s=expiry_s,
            learner_version=learner.learner_version,
            staleness_bound=learner.staleness_bound,
        )
        await send_json(send, 200, answer.model_dump_json().encode())
        return True

    def batcher(self) -> HeartbeatBatcher:
        if self._batcher is None:  # made on first use: on the event loop that serves the requests
            self._batcher = HeartbeatBatcher(self.sync_client, self.state.coordinator.keys)
        return self._batcher

    def batcher_counts(self) -> tuple[int, int]:
        """(heartbeats served here, Redis script calls that carried them)."""
        batcher = self._batcher
        return (batcher.num_entries, batcher.num_calls) if batcher is not None else (0, 0)

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
            self._batcher = None


async def send_json(send: Send, status: int, payload: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when the client went away."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, then the connection's own messages (a disconnect, when it comes)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
