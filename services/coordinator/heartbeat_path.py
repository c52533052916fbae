"""The heartbeat's hot path: a small ASGI layer in front of FastAPI that serves a worker's heartbeat with
its own token in one Redis round trip, on the event loop, without FastAPI's routing and dependency
machinery (which alone costs ~0.6 ms of CPU per request on a 2-core machine: too much for 1000 workers
beating once a second next to Redis and the load generator; benchmarks/load_heartbeat.py).

    POST /v1/workers/<id>/heartbeat, "Authorization: Bearer <id>.<secret>", a valid HeartbeatRequest
        -> one Lua script, atomically: the token's sha256 against the stored one, the lease rule of
           WorkerRegistry.extend_lease, the reported fields, and whether the reported weight swap is
           news for T_bcast (only then the broadcast bookkeeping runs, in a thread)
        -> 200 with the state the control loop decided and the learner's version as of its last pass
    anything else (another token, a bad body, an unknown or dead worker, a wrong token)
        -> handed to the FastAPI endpoint unchanged (body replayed), which answers exactly as before:
           401, 403, 404, 410 or 422 with its reason

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
import redis.asyncio
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from services.coordinator.auth import TOKEN_SEPARATOR, token_sha256
from services.coordinator.broadcast_times import BroadcastTimes
from services.coordinator.schemas import HeartbeatRequest, HeartbeatResponse
from services.coordinator.worker_registry import _to_redis_fields

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# KEYS: worker hash, leases, swaps hash of the reported version (any key when none). ARGV: worker id,
# token sha256, now_s, new expiry_s, "1" to check the swap, the fields to set as a JSON object of strings.
# Returns {code, state, swap is news}: code 0 unknown worker, -1 wrong token, 1 dead (now marked so), 2 ok.
_HEARTBEAT_LUA = """
local digest = redis.call('HGET', KEYS[1], 'token_sha256')
if not digest then return {0, '', 0} end
if digest ~= ARGV[2] then return {-1, '', 0} end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'dead' then return {1, state, 0} end
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if (not expiry) or tonumber(expiry) <= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'state', 'dead')
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {1, 'dead', 0}
end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
local flat = {'lease_expires_at_s', ARGV[4]}
for name, value in pairs(cjson.decode(ARGV[6])) do
  flat[#flat + 1] = name
  flat[#flat + 1] = value
end
redis.call('HSET', KEYS[1], unpack(flat))
local news = 0
if ARGV[5] == '1' and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then news = 1 end
return {2, state, news}
"""

OK = 2
PATH = re.compile(r"^/v1/workers/([A-Za-z0-9_.-]{1,64})/heartbeat$")
MAX_BODY_BYTES = 64 * 1024
INLINE_COMPLETION_MAX_WORKERS = 64
MAX_CONNECTIONS = 32  # one script call holds a connection for ~0.1 ms
POOL_WAIT_S = 5.0
_SHARED_CONNECTION_KWARGS = ("host", "port", "db", "username", "password", "socket_timeout", "socket_connect_timeout")


class HeartbeatFastPath:
    """ASGI middleware; `app.state.coordinator` and `app.state.control` are read per request."""

    def __init__(self, app: ASGIApp, sync_client: redis.Redis, state: Any) -> None:
        self.app = app
        self.state = state  # the FastAPI app's state: coordinator, control
        kwargs = sync_client.connection_pool.connection_kwargs
        self.connection_kwargs = {name: kwargs[name] for name in _SHARED_CONNECTION_KWARGS if name in kwargs}
        if "path" in kwargs:  # a unix socket
            self.connection_kwargs["unix_socket_path"] = kwargs["path"]
        self._client: redis.asyncio.Redis | None = None
        self._script: Any = None
        state.heartbeat_fast_path = self  # so the app's lifespan can close the client

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
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # as services/coordinator/errors.py: retry
                await send_json(send, 503, {"detail": f"redis is unreachable: {exc}"}, [(b"retry-after", b"1")])
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
        swap = request.last_swap
        keys = coordinator.keys
        fields = _to_redis_fields({**request.model_dump(exclude={"last_swap"}), "last_heartbeat_s": now_s})
        code, state, news = await self.script()(
            keys=[keys.worker(worker_id), keys.worker_leases, keys.broadcast_swaps(swap.policy_version) if swap else keys.worker(worker_id)],
            args=[worker_id, token_sha256(token), repr(now_s), repr(expiry_s), "1" if swap else "0", json.dumps(fields)],
        )
        if int(code) != OK:
            return False  # unknown, wrong token or dead: the general path says which
        if news:  # T_bcast bookkeeping (services/coordinator/broadcast_times.py). Completing a version reads
            # every worker, per report: O(N^2) a version. Past INLINE_COMPLETION_MAX_WORKERS the control loop
            # completes versions instead, once a pass.
            snapshot = self.state.control.snapshot
            inline = snapshot is None or len(snapshot.workers) <= INLINE_COMPLETION_MAX_WORKERS
            times = BroadcastTimes(coordinator.redis, keys)
            await run_in_threadpool(times.record_swap, worker_id, swap, coordinator.registry.list_workers, inline)
        learner = self.state.control.learner_view()
        answer = HeartbeatResponse(
            state=state.decode() if isinstance(state, bytes) else state, lease_expires_at_s=expiry_s,
            learner_version=learner.learner_version, staleness_bound=learner.staleness_bound,
        )
        await send_json(send, 200, answer.model_dump(mode="json"))
        return True

    def script(self) -> Any:
        if self._client is None:
            # a burst of heartbeats waits for one of a few connections instead of failing ("Too many connections")
            pool = redis.asyncio.BlockingConnectionPool(max_connections=MAX_CONNECTIONS, timeout=POOL_WAIT_S, **self.connection_kwargs)
            self._client = redis.asyncio.Redis(connection_pool=pool)
            self._script = self._client.register_script(_HEARTBEAT_LUA)
        return self._script

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            await self._client.connection_pool.disconnect()
            self._client = None


async def send_json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *(headers or []),
    ]})
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
