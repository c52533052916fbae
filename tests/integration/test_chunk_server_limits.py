"""The chunk server's limits against real sockets: bounded threads, idle and dribbling connections
closed after the stated timeout, a reader that stops reading cut off, absurd numbers in a URL answered
400 (shared/weight_channel/server.py, "Limits")."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from shared.weight_channel import ChunkServer, ChunkStore
from shared.weight_channel.manifest import build_manifest
from tests.polling import wait_for
from tests.sockets import closed_by_server
from tests.weights_keys import SIGNING_KEY

pytestmark = pytest.mark.integration


@pytest.fixture
def limited_server() -> Iterator[ChunkServer]:
    server = ChunkServer(
        ChunkStore(keep_versions=2), wait_s=1.0, max_connections=4, request_timeout_s=0.5, send_timeout_s=0.5
    ).start()
    yield server
    server.stop()


def connect(server: ChunkServer) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=5.0)


def test_idle_connections_beyond_the_limit_are_refused_and_the_rest_closed_after_the_timeout() -> None:
    # 2 s to complete a request head: long enough that the four idle ones are still held while the
    # twenty more are refused, short enough to watch them closed
    limited_server = ChunkServer(ChunkStore(), max_connections=4, request_timeout_s=2.0).start()
    threads_before = threading.active_count()
    idle = [connect(limited_server) for _ in range(4)]
    wait_for(lambda: limited_server.num_connections == 4, "four connections served")
    extra = [connect(limited_server) for _ in range(20)]
    try:
        for sock in extra:  # answered at once, from the accepting thread
            sock.settimeout(5.0)
            assert sock.recv(4096).startswith(b"HTTP/1.1 503")
        assert limited_server.num_refused == 20
        assert threading.active_count() <= threads_before + 4
        # the four idle ones are closed after request_timeout_s (0.5 s), freeing their threads
        assert all(closed_by_server(sock, timeout_s=5.0) for sock in idle)
        wait_for(lambda: limited_server.num_connections == 0, "idle connections closed")
        assert httpx.get(limited_server.url + "/healthz").text == "ok"
    finally:
        for sock in idle + extra:
            sock.close()
        limited_server.stop()


def test_a_dribbling_client_is_cut_off_at_the_request_timeout(limited_server: ChunkServer) -> None:
    sock = connect(limited_server)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    started_s = time.monotonic()
    try:
        for byte in request:  # one byte per 50 ms: every single read is quick, the head never completes in time
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            if closed_by_server(sock, timeout_s=0.05):
                break
        cut_after_s = time.monotonic() - started_s
    finally:
        sock.close()
    assert cut_after_s < 2.0, f"the dribbling connection lived {cut_after_s:.1f} s"
    wait_for(lambda: limited_server.num_connections == 0, "the dribbling connection's thread released")


def test_a_reader_that_stops_reading_is_cut_off_after_the_send_timeout(limited_server: ChunkServer) -> None:
    payload = os.urandom(32 * 1024 * 1024)
    manifest, chunks = build_manifest(
        payload, run_id="r", policy_version=1, chunk_size_bytes=len(payload), signing_key=SIGNING_KEY
    )
    limited_server.store.put_version(manifest, chunks, verified=True)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((limited_server.host, limited_server.port))
    try:
        sock.sendall(b"GET /v1/weights/1/chunks/0 HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_for(lambda: limited_server.num_connections == 1, "the chunk request served")
        # never read: the server's send stalls and it gives up after send_timeout_s per piece
        wait_for(lambda: limited_server.num_connections == 0, "the stalled response abandoned", timeout_s=10.0)
    finally:
        sock.close()


@pytest.mark.parametrize(
    "path",
    [
        "/v1/weights/" + "9" * 5000 + "/manifest",
        "/v1/weights/1/full/chunks/" + "9" * 5000,
        "/v1/weights/" + "9" * 19 + "/full/stream",
        "/v1/weights/1/full/stream?from=" + "9" * 5000,
    ],
)
def test_absurd_numbers_in_a_url_are_a_400_and_the_server_goes_on(limited_server: ChunkServer, path: str) -> None:
    with httpx.Client(base_url=limited_server.url) as client:
        response = client.get(path)
        assert response.status_code == 400, response.text
        assert "digits" in response.text or "bad query" in response.text
        assert client.get("/healthz").text == "ok"  # same connection pool, same server: still serving
