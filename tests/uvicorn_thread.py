"""Running a FastAPI app under a real uvicorn server in a thread, for integration tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from cluster.ports import free_port
from tests.polling import wait_for


@contextlib.contextmanager
def serve(app: FastAPI, port: int | None = None) -> Iterator[str]:
    """Run `app` under uvicorn in a thread (on `port`, default a free one); yields its base URL; stops it
    (lifespan included) on exit."""
    port = free_port() if port is None else port
    # long polls (GET /v1/weights/latest) are cut after 1 s at stop: a worker retries them
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server thread died before the server started"
        return server.started

    wait_for(started, "the server to start", timeout_s=10, interval_s=0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "server did not stop"
