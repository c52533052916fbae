"""One Lua script on one asyncio connection to Redis, with nothing else in the way.

A hot path that runs the same script many times a second (the coordinator's heartbeats) spends most of
its CPU in redis-py's asyncio client: command packing, the connection pool, the retry wrapper and reply
parsing cost ~0.4 ms a call on a 2-core machine, more than the rest of the request. Here a call is one
pre-packed RESP write and one read parsed in C by hiredis (~0.05 ms). The script is run by its SHA1; the
first call on a fresh Redis (NOSCRIPT) sends the source once.

Errors match redis-py's, so callers keep one policy: redis.ConnectionError when the connection fails or
closes (the connection is dropped and the next call dials again), redis.TimeoutError when Redis does not
answer within `timeout_s`, and for an error reply the class redis-py's parser gives it
(shared/retry.py: redis_reply_error): BusyLoadingError (a ConnectionError) while Redis loads its data,
OutOfMemoryError at maxmemory, a ResponseError for a failing script.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import hiredis
import redis

from shared.retry import redis_reply_error

DEFAULT_TIMEOUT_S = 5.0
READ_BYTES = 65536


def pack_command(*parts: bytes | str) -> bytes:
    """A RESP array of bulk strings."""
    encoded = [part.encode() if isinstance(part, str) else part for part in parts]
    return b"".join([b"*%d\r\n" % len(encoded), *(b"$%d\r\n%s\r\n" % (len(part), part) for part in encoded)])


class ScriptConnection:
    """`await call(keys, args)` runs the script and returns its reply (bytes, ints, nested lists).

    One call at a time per connection (callers batch: services/coordinator/heartbeat_batch.py)."""

    def __init__(
        self,
        script: str,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        unix_socket_path: str | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        tls: bool = False,
    ) -> None:
        self.script = script
        self.sha1 = hashlib.sha1(script.encode()).hexdigest()
        self.host, self.port, self.db = host, port, db
        self.username, self.password, self.unix_socket_path = username, password, unix_socket_path
        self.timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        self.tls = tls  # rediss://: the system's CA store verifies the server
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser = hiredis.Reader()
        self._lock = asyncio.Lock()

    @classmethod
    def like(cls, client: redis.Redis, script: str) -> ScriptConnection:
        """A connection to the same Redis (address, database, credentials) as a redis-py client."""
        kwargs = client.connection_pool.connection_kwargs
        return cls(
            script,
            host=kwargs.get("host", "127.0.0.1"),
            port=kwargs.get("port", 6379),
            db=kwargs.get("db", 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            unix_socket_path=kwargs.get("path"),
            timeout_s=kwargs.get("socket_timeout"),
            tls=issubclass(client.connection_pool.connection_class, redis.SSLConnection),
        )

    async def call(self, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout_s):
                    reply = await self._round_trip(pack_command("EVALSHA", self.sha1, str(len(keys)), *keys, *args))
                    if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
                        reply = await self._round_trip(pack_command("EVAL", self.script, str(len(keys)), *keys, *args))
            except TimeoutError as exc:
                await self.close()  # a late reply must not be read as the next call's
                raise redis.TimeoutError(f"redis did not answer within {self.timeout_s}s") from exc
            except (OSError, EOFError, asyncio.IncompleteReadError, hiredis.ProtocolError) as exc:
                await self.close()
                raise redis.ConnectionError(f"redis connection failed: {exc}") from exc
        if isinstance(reply, hiredis.ReplyError):
            raise redis_reply_error(str(reply))
        return reply

    async def _round_trip(self, request: bytes) -> Any:
        if self._writer is None:
            await self._connect()
        assert self._reader is not None and self._writer is not None
        self._writer.write(request)
        return await self._read_reply()

    async def _read_reply(self) -> Any:
        assert self._reader is not None
        while True:
            reply = self._parser.gets()
            if reply is not False:
                return reply
            data = await self._reader.read(READ_BYTES)
            if not data:
                raise EOFError("redis closed the connection")
            self._parser.feed(data)

    async def _connect(self) -> None:
        if self.unix_socket_path:
            self._reader, self._writer = await asyncio.open_unix_connection(self.unix_socket_path)
        else:
            self._reader, self._writer = await asyncio.open_connection(
                self.host, self.port, ssl=True if self.tls else None
            )
        self._parser = hiredis.Reader()
        if self.password is not None:
            reply = await self._round_trip(
                pack_command("AUTH", *([self.username] if self.username else []), self.password)
            )
            if isinstance(reply, hiredis.ReplyError):
                await self.close()
                raise redis.AuthenticationError(str(reply))
        if self.db:
            reply = await self._round_trip(pack_command("SELECT", str(self.db)))
            if isinstance(reply, hiredis.ReplyError):
                await self.close()
                raise redis_reply_error(str(reply))

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ConnectionError):
                pass  # already broken: closing is all that was asked
