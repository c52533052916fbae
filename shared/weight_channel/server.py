"""The chunk protocol's serving end (protocol.py): a ChunkServer serves a ChunkStore (store.py) over HTTP.

Liveness is progress, not a deadline: a request for a chunk not held yet waits as long as this holder's
own copy of the artifact makes progress (bytes arriving, chunks verified) and gives up only after
`wait_s` with none. A healthy chain of any depth and any chunk size never trips it: every holder's copy
moves while its parent's does (docs/weight_path.md, "Liveness"). A request for an artifact this holder
has not heard of yet waits for its manifest (up to `wait_s`): that is what lets a child pipeline behind
its parent, which may itself still be receiving.

Cut-through: the stream route forwards a chunk's bytes to a child while they arrive here (in pieces of
the receiver's read size), not after the whole chunk is verified, so a hop costs a piece, not a chunk;
the verdict byte after each chunk says whether this holder verified exactly those bytes. A child
verifies every chunk itself against the signed manifest either way; the verdict only says whom to
blame, so an honest relay behind a bad one is not dropped for bytes it passed on. A held chunk is sent
from its view with one `sendall` (no copy in Python); a chunk still arriving is forwarded from its
region as the receiver reports its bytes (`ChunkStore.note_received`).

Limits (anyone who can reach the port can connect; a worker's server is open to its relay children):
- at most `max_connections` connections are served at once, one thread each; one more is answered
  503 and closed at once (the child moves to another holder), so idle connections cannot pile up threads;
- a connection must deliver a whole request head within `request_timeout_s` of connecting or of its
  previous response (keep-alive), however slowly its bytes dribble in; otherwise it is closed;
- a response is sent in pieces of `SEND_PIECE_BYTES`, each of which the client must take within
  `send_timeout_s` (a reader that stops reading is cut off; a slow but moving one is not);
- versions and chunk indices are decimal numbers of at most `MAX_NUMBER_DIGITS` digits: anything
  longer is answered 400 before it is parsed.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from shared.weight_channel.manifest import Manifest, Payload, as_payload
from shared.weight_channel.protocol import (
    CHUNK_ROUTE,
    HEALTH_BODY,
    HEALTH_PATH,
    LATEST_PATH,
    MANIFEST_ROUTE,
    MAX_NUMBER_DIGITS,
    STREAM_REJECTED,
    STREAM_ROUTE,
    STREAM_VERIFIED,
)
from shared.weight_channel.store import ChunkStore, ManifestMismatchError

log = logging.getLogger(__name__)

SEND_PIECE_BYTES = 256 * 1024  # a response leaves in pieces this big, each within send_timeout_s
MAX_CONNECTIONS = 128  # connections served at once (one thread each): a worker's children, the learner's fetchers
REQUEST_TIMEOUT_S = 10.0  # from connecting (or the previous response) to a complete request head
SEND_TIMEOUT_S = 30.0  # per SEND_PIECE_BYTES taken by the client: 8.7 KB/s is the slowest reader kept


class ChunkServer:
    """Serves a ChunkStore over HTTP from a background thread: one thread per connection, at most
    `max_connections` at once, each closed when idle or dribbling (module docstring, "Limits")."""

    def __init__(
        self,
        store: ChunkStore,
        host: str = "127.0.0.1",
        port: int = 0,
        wait_s: float = 10.0,
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        send_timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        if max_connections < 1 or request_timeout_s <= 0 or send_timeout_s <= 0:
            raise ValueError(
                f"need max_connections >= 1 and positive timeouts, got {max_connections}, "
                f"{request_timeout_s}, {send_timeout_s}"
            )
        self.store = store
        self.wait_s = wait_s
        serving = _Serving(store, wait_s, request_timeout_s, send_timeout_s)
        self._httpd = _BoundedHTTPServer((host, port), serving, max_connections)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="chunk-server", daemon=True
        )  # the poll interval bounds how long stop() takes

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def host(self) -> str:
        host = self._httpd.server_address[0]
        return host if isinstance(host, str) else host.decode()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ChunkServer:
        self._thread.start()
        return self

    @property
    def num_connections(self) -> int:
        """Connections being served now (each holds a thread)."""
        return self._httpd.num_connections

    @property
    def num_refused(self) -> int:
        """Connections answered 503 because `max_connections` were being served."""
        return self._httpd.num_refused

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


_AT_CAPACITY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 25\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n\r\nchunk server at capacity\n"
)


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them: one more is answered 503 from the
    accepting thread (without blocking it: the answer fits an empty send buffer) and closed. Each
    connection's handler (_ChunkHandler) serves `serving`'s store under its bounds."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: socketserver's 5 drops a burst of children connecting

    def __init__(self, address: tuple[str, int], serving: _Serving, max_connections: int) -> None:
        super().__init__(address, _ChunkHandler)
        self.serving = serving
        self.max_connections = max_connections
        self.num_connections = 0
        self.num_refused = 0
        self._count_lock = threading.Lock()

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        with self._count_lock:
            full = self.num_connections >= self.max_connections
            if full:
                self.num_refused += 1
            else:
                self.num_connections += 1
        if full:
            log.warning("chunk server at capacity (%d connections): refused %s", self.max_connections, client_address)
            try:
                request.setblocking(False)
                request.send(_AT_CAPACITY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._count_lock:
            self.num_connections -= 1

    def handle_error(self, request: object, client_address: object) -> None:
        """An exception that escaped a handler (a client vanished mid-request, say): one line for the
        connection it closed, not a traceback on stderr; the server goes on."""
        log.warning("chunk server: a request from %s failed", client_address, exc_info=log.isEnabledFor(logging.DEBUG))


class _DeadlineReader(io.RawIOBase):
    """The connection's reading side: every read waits at most until `deadline_s` (monotonic), so a
    request head dribbled in a byte at a time still has to be complete by then."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline_s = float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        remaining_s = self.deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError("the request head did not arrive in time")
        self.sock.settimeout(remaining_s)
        return self.sock.recv_into(buffer)


class _PacedWriter(io.BufferedIOBase):
    """The connection's writing side: sends in pieces of SEND_PIECE_BYTES, each within `timeout_s`
    (socket.sendall's timeout bounds a whole call, which would cut off a large chunk on a slow link)."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self.timeout_s = timeout_s

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self.sock.settimeout(self.timeout_s)
        for start in range(0, len(view), SEND_PIECE_BYTES):
            self.sock.sendall(view[start : start + SEND_PIECE_BYTES])
        return len(view)


class _BadRequestError(ValueError):
    """A request this server refuses to parse: answered 400 with the reason."""


def _parse_number(text: str, what: str) -> int:
    """A version or chunk index from the URL (digits already matched): 400 for an absurd length, before
    int() is asked to parse it (Python refuses over 4,300 digits with an error outside any handler)."""
    if len(text) > MAX_NUMBER_DIGITS:
        raise _BadRequestError(f"{what} has {len(text)} digits (at most {MAX_NUMBER_DIGITS})")
    return int(text)


@dataclass(frozen=True)
class _Serving:
    """What every request on a ChunkServer needs: its store and its bounds (module docstring, "Limits")."""

    store: ChunkStore
    wait_s: float  # how long a request waits for progress on a chunk (or for a manifest) before giving up
    request_timeout_s: float
    send_timeout_s: float


class _ChunkHandler(BaseHTTPRequestHandler):
    """One connection to a ChunkServer: its requests, one after another (keep-alive). The store and the
    bounds come from the server that accepted it (`_BoundedHTTPServer.serving`)."""

    protocol_version = "HTTP/1.1"
    server: _BoundedHTTPServer

    def setup(self) -> None:
        super().setup()
        self.serving = self.server.serving
        self.store = self.serving.store
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        self.wfile = _PacedWriter(self.connection, self.serving.send_timeout_s)

    def handle_one_request(self) -> None:
        # the next request head must be complete within request_timeout_s (idle keep-alive included);
        # a TimeoutError here or while sending closes the connection (BaseHTTPRequestHandler's policy)
        self._reader.deadline_s = time.monotonic() + self.serving.request_timeout_s
        super().handle_one_request()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path, _, query_string = self.path.partition("?")
        query = {name: values[-1] for name, values in parse_qs(query_string).items()}
        try:
            self._route(path, query)
        except _BadRequestError as exc:  # policy: a malformed request is answered 400, the server goes on
            self._send(400, f"bad request: {exc}".encode(), "text/plain")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (a child switched holders)

    def _route(self, path: str, query: dict[str, str]) -> None:
        store = self.store
        if path == HEALTH_PATH:
            return self._send(200, HEALTH_BODY, "text/plain")
        if path == LATEST_PATH:
            version = store.latest_complete_version()
            manifest = store.manifest(version) if version is not None else None
            return self._send_manifest(manifest, "no complete version held")
        if match := MANIFEST_ROUTE.match(path):
            version, payload = _parse_number(match[1], "version"), as_payload(match[2] or "full")
            return self._send_manifest(store.manifest(version, payload), f"version {version}/{payload} not held")
        if match := CHUNK_ROUTE.match(path):
            version, payload = _parse_number(match[1], "version"), as_payload(match[2] or "full")
            index = _parse_number(match[3], "chunk index")
            return self._send_chunk(version, payload, index, query.get("manifest"))
        if match := STREAM_ROUTE.match(path):
            return self._send_stream(_parse_number(match[1], "version"), as_payload(match[2]), query)
        return self._send(404, f"no route {path}".encode(), "text/plain")

    def _send_manifest(self, manifest: Manifest | None, missing: str) -> None:
        if manifest is None:
            return self._send(404, missing.encode(), "text/plain")
        return self._send(200, manifest.to_json(), "application/json")

    def _send_chunk(self, version: int, payload: Payload, index: int, manifest_sha256: str | None) -> None:
        wait_s = self.serving.wait_s
        try:
            chunk = self.store.get_chunk(
                version, index, wait_s=wait_s, payload=payload, manifest_sha256=manifest_sha256
            )
        except ManifestMismatchError as exc:
            return self._send(409, str(exc).encode(), "text/plain")
        except KeyError as exc:
            return self._send(404, str(exc).encode(), "text/plain")
        if chunk is None:
            return self._send(
                504,
                f"chunk {index} of version {version}/{payload} still missing: no progress here for {wait_s}s".encode(),
                "text/plain",
            )
        return self._send(200, chunk, "application/octet-stream")

    def _send_stream(self, version: int, payload: Payload, query: dict[str, str]) -> None:
        """Chunks `from`.. of the artifact, each followed by its verdict byte (STREAM_VERIFIED or
        STREAM_REJECTED), each forwarded as its bytes arrive here. The length is known up front (the
        manifest), so an artifact that stops making progress here ends the body short."""
        opened = self._open_stream(version, payload, query)
        if opened is None:
            return None
        manifest, first = opened
        sha256 = manifest.sha256()
        requester_url = query.get("holder", "")  # the asking worker's own chunk server (relay cycles)
        for index in range(first, manifest.num_chunks):
            try:
                verified = self._forward_chunk(manifest, sha256, index, requester_url)
            except KeyError as exc:  # evicted or replaced mid-stream
                verified, why = None, str(exc)
            else:
                why = (
                    f"this holder's copy comes from {requester_url}, the one asking (a relay cycle)"
                    if requester_url and self.store.source_of(manifest) == requester_url.rstrip("/")
                    else f"no progress here for {self.serving.wait_s}s"
                )
            if verified is None:
                log.warning("stream of %s ends at chunk %d: %s", manifest.artifact, index, why)
                self.close_connection = True
                return None
            self.wfile.write(STREAM_VERIFIED if verified else STREAM_REJECTED)
        return None

    def _open_stream(self, version: int, payload: Payload, query: dict[str, str]) -> tuple[Manifest, int] | None:
        """The stream's manifest (waited for, up to `wait_manifest_s`) and first chunk, with the response
        head sent; None once a 4xx has answered the request instead."""
        wait_s = self.serving.wait_s
        try:
            first = _parse_number(query.get("from", "0"), "from")
            wait_manifest_s = min(wait_s, float(query.get("wait_manifest_s", wait_s)))
            manifest = self.store.wait_for_manifest(version, payload, query.get("manifest"), wait_manifest_s)
        except ValueError as exc:
            self._send(400, f"bad query: {exc}".encode(), "text/plain")
            return None
        except ManifestMismatchError as exc:
            self._send(409, str(exc).encode(), "text/plain")
            return None
        if manifest is None:
            self._send(404, f"version {version}/{payload} not held after {wait_manifest_s}s".encode(), "text/plain")
            return None
        if not 0 <= first <= manifest.num_chunks:
            self._send(400, f"from={first} outside 0..{manifest.num_chunks}".encode(), "text/plain")
            return None
        # a verdict byte or a piece must leave at once, not wait for an ACK (Nagle) at every hop
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        num_chunks = manifest.num_chunks - first
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        body_bytes = manifest.total_size_bytes - first * manifest.chunk_size_bytes + num_chunks
        self.send_header("Content-Length", str(body_bytes))
        self.end_headers()
        return manifest, first

    def _forward_chunk(self, manifest: Manifest, sha256: str, index: int, requester_url: str = "") -> bool | None:
        """Send chunk `index`: whole if it is held, else cut-through as its bytes arrive. Returns
        whether what was sent is the chunk verified here (the verdict), None when this holder's copy
        stalled, or comes from `requester_url` itself (the stream must end)."""
        store, wait_s = self.store, self.serving.wait_s
        held = store.get_chunk(
            manifest.policy_version, index, wait_s=0.0, payload=manifest.payload, manifest_sha256=sha256
        )
        if held is not None:
            self.wfile.write(held)
            return True
        length, offset, attempts = manifest.chunk_length(index), 0, set()
        while offset < length:
            received = store.wait_received(manifest, index, offset, wait_s, requester_url)
            if received is None:
                return None
            if received.held and offset == 0:  # verified before a byte left: the held path
                return self._forward_chunk(manifest, sha256, index, requester_url)
            attempts.add(received.attempt)
            self.wfile.write(received.data)
            offset += len(received.data)
        return store.wait_verdict(manifest, index, attempts, wait_s)

    def _send(self, status: int, body: bytes | memoryview, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        log.debug("chunk-server: " + format, *args)
