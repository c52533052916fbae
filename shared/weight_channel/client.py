"""The chunk protocol's fetching end (protocol.py): weights from a chunk server over HTTP, every byte
verified before it is used.

The manifest's signature is checked against the learner's public key first; each chunk is checked against
the manifest's digest as it arrives, in its place in a ChunkStore's buffer (which is what lets this
holder relay it to its own children). Every chunk verified against the signed manifest is the whole
payload verified (manifest.py: the payload digest is derived from the chunk digests).

Two transports:
- `fetch_manifest` / `fetch_chunk` / `fetch_version`: one request per object (httpx); used for
  manifests (and by tests and tools for whole versions). Their reads have a timeout each and no bound in
  all, so nothing fetches chunks from a worker this way: a repair is the first chunk of a ChunkStream.
- `holder_answers`: whether a holder's chunk server can be reached from here at all (the coordinator's
  connect-back probe: services/coordinator/reachability.py).
- `ChunkStream`: one request for chunks i.. of an artifact, read chunk by chunk as the holder sends
  them (stdlib http.client: `readinto` straight off the socket into the chunk's final place, with a
  per-read timeout, which is how a stalled holder is noticed). This is the relay path: no per-chunk
  round trip keeps the link idle, and no copy of the bytes in Python. It reads each chunk in pieces of
  `RELAY_PIECE_BYTES` and reports each one (`on_bytes`), so this holder forwards them to its own
  children before the chunk is complete (cut-through: a hop costs a piece, not a chunk); each chunk is
  followed by the holder's verdict byte (protocol.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import socket
from collections.abc import Callable
from concurrent.futures import Executor
from urllib.parse import urlsplit

import httpx

from shared.signing import Ed25519PublicKey
from shared.weight_channel.manifest import Manifest, Payload, WeightsError, verify_chunk, verify_signature
from shared.weight_channel.protocol import (
    HEALTH_BODY,
    HEALTH_PATH,
    RELAY_PIECE_BYTES,
    STREAM_REJECTED,
    STREAM_VERIFIED,
    chunk_path,
    manifest_path,
    stream_path,
)
from shared.weight_channel.store import ChunkStore


class FetchError(WeightsError):
    """The source could not deliver (connection refused, timeout, HTTP error, short body)."""


def fetch_manifest(
    client: httpx.Client,
    base_url: str,
    policy_version: int | None,
    public_key: Ed25519PublicKey,
    payload: Payload | None = None,
) -> Manifest:
    """The signed manifest of `policy_version` (its full payload unless `payload` says otherwise), or
    the source's newest complete version when `policy_version` is None. Raises ManifestError unless the
    learner's key (`public_key`) signed it, whoever served it."""
    body = _get(client, base_url + manifest_path(policy_version, payload))
    manifest = Manifest.from_json(body)
    verify_signature(manifest, public_key)
    if policy_version is not None and manifest.policy_version != policy_version:
        raise FetchError(f"{base_url} answered version {manifest.policy_version} for {policy_version}")
    if payload is not None and manifest.payload != payload:
        raise FetchError(f"{base_url} answered a {manifest.payload} payload for {payload}")
    return manifest


def fetch_chunk(client: httpx.Client, base_url: str, manifest: Manifest, index: int) -> bytes:
    data = _get(client, base_url + chunk_path(manifest, index))
    verify_chunk(manifest, index, data)
    return data


def fetch_version(
    client: httpx.Client, base_url: str, manifest: Manifest, store: ChunkStore | None = None
) -> memoryview:
    """Every chunk of `manifest` from `base_url`, one request each, verified into `store` (a new
    in-memory one when None); the payload, as a view of the store's buffer."""
    store = store if store is not None else ChunkStore(keep_versions=1)
    store.add_manifest(manifest)
    for index in range(manifest.num_chunks):
        store.put_chunk(
            manifest.policy_version, index, fetch_chunk(client, base_url, manifest, index), manifest.payload
        )
    return store.payload(manifest)


MAX_PROBE_RESPONSE_BYTES = 1024  # a health answer is ~150 bytes; a holder cannot make a probe read more


async def holder_answers(base_url: str, timeout_s: float, resolver: Executor | None = None) -> bool:
    """Whether the chunk server at `base_url` answers from here: a new TCP connection to it and GET /healthz
    answered 200 "ok", all within `timeout_s`. Plain sockets, so no proxy from the environment, no
    keep-alive (the connection is what is probed) and no redirect; at most MAX_PROBE_RESPONSE_BYTES read.
    False for anything else: refused, unresolvable, silent, slow, another server, not an http:// URL.
    The host name is looked up in `resolver`'s threads (None: the event loop's default executor): a lookup
    cannot be cancelled, so a caller probing names it does not trust gives them threads of their own."""
    target = _health_request(base_url)
    if target is None:
        return False
    host, port, request = target
    try:
        async with asyncio.timeout(timeout_s):
            lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
            address = str((await asyncio.get_running_loop().run_in_executor(resolver, lookup))[0][4][0])
            reader, writer = await asyncio.open_connection(address, port)  # an address: no second lookup
            try:
                writer.write(request)
                await writer.drain()
                response = await _read_at_most(reader, MAX_PROBE_RESPONSE_BYTES)
            finally:
                writer.close()
    except (OSError, TimeoutError):  # refused, unreachable, unresolvable (gaierror); silent or slow
        return False
    head, _, body = response.partition(b"\r\n\r\n")
    version, _, status = head.partition(b"\r\n")[0].partition(b" ")
    return version.startswith(b"HTTP/1.") and status.startswith(b"200 ") and body == HEALTH_BODY


def _health_request(base_url: str) -> tuple[str, int, bytes] | None:
    """(host, port, the GET /healthz request) of an http:// URL; None for any other, or for one with a
    space, a control character or non-ASCII text (nothing in the URL may add a line to the request)."""
    if not (base_url.isascii() and base_url.isprintable()) or " " in base_url:
        return None
    try:
        parts = urlsplit(base_url)
        port = parts.port or 80
    except ValueError:  # a port that is not a number or out of range, a malformed IPv6 address
        return None
    if parts.scheme != "http" or not parts.hostname:
        return None
    path = parts.path.rstrip("/") + HEALTH_PATH
    return parts.hostname, port, f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode()


async def _read_at_most(reader: asyncio.StreamReader, num_bytes: int) -> bytes:
    """What the peer sends until it closes, or the first `num_bytes` of it."""
    data = bytearray()
    while len(data) < num_bytes:
        piece = await reader.read(num_bytes - len(data))
        if not piece:
            break
        data += piece
    return bytes(data)


class ChunkStream:
    """Chunks `first`, `first`+1, ... of `manifest`'s artifact from one holder, in one response.

    `open()` sends the request and reads the response head; `next_chunk()` returns the bytes of the next
    chunk exactly as sent (unverified: the caller verifies, so it can tell a corrupt chunk from a dead
    holder). Every read waits at most `stall_timeout_s` (the head's, `stall_timeout_s` + `wait_manifest_s`:
    the holder may wait for the manifest before it answers); a holder that sends a byte now and then, in
    the head or the body, is bounded only by whoever calls `abort()` (relay_fetch.py's StreamGuard). Any
    failure raises FetchError naming the holder and the chunk."""

    def __init__(
        self,
        base_url: str,
        manifest: Manifest,
        first: int,
        *,
        stall_timeout_s: float,
        wait_manifest_s: float,
        requester_url: str = "",
    ) -> None:
        self.base_url = base_url
        self.manifest = manifest
        self.next_index = first
        self.stall_timeout_s = stall_timeout_s
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise FetchError(f"{base_url!r} is not an http:// URL")
        self._path = parts.path.rstrip("/") + stream_path(manifest, first, wait_manifest_s, requester_url)
        self._connection = http.client.HTTPConnection(
            parts.hostname, parts.port or 80, timeout=stall_timeout_s + wait_manifest_s
        )
        self._response: http.client.HTTPResponse | None = None
        self._aborted = False

    def open(self) -> ChunkStream:
        """Connect, send the request, read the response head (status and headers). Raises FetchError."""
        try:
            self._connection.connect()
            if self._aborted:  # abort() came before the socket existed: nothing for it to shut down
                raise TimeoutError("aborted before the response head")
            self._connection.request("GET", self._path)
            self._response = self._connection.getresponse()
            if self._aborted:  # the head was cut off (an end of file ends a head too): not a response
                raise TimeoutError("aborted while the response head arrived")
            if self._connection.sock is None:  # http.client let go of it: a body of no stated length
                raise http.client.HTTPException("a response with no Content-Length")
            self._connection.sock.settimeout(self.stall_timeout_s)  # from now on: a stall is a silent holder
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise FetchError(
                f"stream {self.manifest.artifact} from {self.base_url}: {type(exc).__name__}: {exc}"
            ) from exc
        if self._response.status != 200:
            body = self._response.read(200).decode(errors="replace")
            self.close()
            raise FetchError(
                f"stream {self.manifest.artifact} from {self.base_url}: HTTP {self._response.status}: {body}"
            )
        return self

    def next_chunk(self) -> bytes:
        """The next chunk as new bytes, whatever its verdict (tests, tools, skipping a chunk already held;
        the relay path uses `read_chunk_into`)."""
        data = bytearray(self.manifest.chunk_length(self.next_index))
        self.read_chunk_into(memoryview(data))
        return bytes(data)

    def read_chunk_into(self, region: memoryview, on_bytes: Callable[[int], None] | None = None) -> bool:
        """Read the next chunk from the socket straight into `region` (exactly its length), calling
        `on_bytes(num_bytes_so_far)` after each piece, then its verdict byte. Returns whether the holder
        vouches for the bytes (it verified them; False: they failed its own check, discard them).
        Raises FetchError for a stalled or closed holder (the region then holds partial bytes)."""
        assert self._response is not None and self.next_index < self.manifest.num_chunks
        index = self.next_index
        expected = self.manifest.chunk_length(index)
        if len(region) != expected:
            raise ValueError(f"chunk {index} is {expected} bytes, the region {len(region)}")
        received = 0
        try:
            while received < expected:
                count = self._response.readinto(region[received : received + RELAY_PIECE_BYTES])
                if not count:
                    break
                received += count
                if on_bytes is not None:
                    on_bytes(received)
            verdict = self._response.read(1) if received == expected else b""
        except (OSError, http.client.HTTPException) as exc:  # socket.timeout is an OSError
            what = "stalled" if isinstance(exc, socket.timeout) else f"{type(exc).__name__}: {exc}"
            raise FetchError(f"stream {self.manifest.artifact} from {self.base_url}, chunk {index}: {what}") from exc
        if received != expected or verdict not in (STREAM_VERIFIED, STREAM_REJECTED):
            raise FetchError(
                f"stream {self.manifest.artifact} from {self.base_url} ended at chunk {index} "
                f"({received} of {expected} bytes): the holder closed it"
            )
        self.next_index += 1
        return verdict == STREAM_VERIFIED

    def abort(self) -> None:
        """From another thread: end a read in progress now, or the opening (it raises FetchError). Shutting
        the socket down wakes a blocked recv; closing it does not. Bounds a holder that keeps sending a byte
        now and then."""
        self._aborted = True  # set before the socket is read: open() checks it once the socket exists
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed or never connected: nothing to end
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._response is not None:
            self._response.close()
        self._connection.close()


def _get(client: httpx.Client, url: str) -> bytes:
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise FetchError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise FetchError(f"GET {url}: HTTP {response.status_code}: {response.text[:200]}")
    return response.content
