"""The coordinator's connection limits under a real uvicorn (services/coordinator/http_limits.py): a
connection that sends nothing or dribbles its request is closed after the request timeout, a request that
has arrived is never cut however long it takes, and past the connection limit requests get 503."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from cluster.ports import free_port
from services.coordinator.http_limits import uvicorn_limits
from tests.polling import wait_for
from tests.sockets import closed_by_server

pytestmark = pytest.mark.integration

REQUEST_TIMEOUT_S = 0.5


def app() -> FastAPI:
    api = FastAPI()

    @api.get("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(3 * REQUEST_TIMEOUT_S)  # the scenario: a long-poll that outlives the request timeout
        return {"ok": "slow"}

    @api.get("/fast")
    async def fast() -> dict[str, str]:
        return {"ok": "fast"}

    return api


@contextlib.contextmanager
def served(max_connections: int = 100) -> Iterator[tuple[str, int]]:
    port = free_port()
    limits = uvicorn_limits(max_connections=max_connections, request_timeout_s=REQUEST_TIMEOUT_S, keep_alive_s=5.0)
    server = uvicorn.Server(uvicorn.Config(app(), host="127.0.0.1", port=port, log_level="warning", **limits))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "uvicorn started", timeout_s=10)
    try:
        yield f"http://127.0.0.1:{port}", port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_a_silent_connection_is_closed_after_the_request_timeout() -> None:
    with served() as (_, port), socket.create_connection(("127.0.0.1", port)) as sock:
        started_s = time.monotonic()
        assert closed_by_server(sock, timeout_s=5.0)
        assert time.monotonic() - started_s < 3.0


def test_a_dribbling_request_is_closed_although_every_byte_arrives_quickly() -> None:
    request = b"GET /fast HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    with served() as (_, port), socket.create_connection(("127.0.0.1", port)) as sock:
        started_s = time.monotonic()
        closed = False
        for byte in request:  # a byte per 50 ms: 7 s for the whole head
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if closed_by_server(sock, timeout_s=0.05):
                closed = True
                break
        assert closed and time.monotonic() - started_s < 3.0


def test_a_request_that_arrived_is_answered_however_long_it_takes_and_keep_alive_goes_on() -> None:
    with served() as (url, _), httpx.Client(base_url=url) as client:
        assert client.get("/slow").json() == {"ok": "slow"}
        assert client.get("/fast").json() == {"ok": "fast"}


def test_past_the_connection_limit_requests_get_503() -> None:
    with served(max_connections=4) as (url, port):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            assert httpx.get(url + "/fast").status_code == 503
        finally:
            for sock in idle:
                sock.close()
        wait_for(lambda: httpx.get(url + "/fast").status_code == 200, "served again once they are gone")
