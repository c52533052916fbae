"""Running a FastAPI app (or any ASGI app) under a real uvicorn server in a thread, for integration tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from cluster.ports import free_port
from cluster.tls import TlsFiles
from tests.polling import wait_for


@contextlib.contextmanager
def serve(
    app: ASGIApp,
    port: int | None = None,
    *,
    tls: TlsFiles | None = None,
    host: str = "127.0.0.1",
    server_class: Callable[[uvicorn.Config], uvicorn.Server] = uvicorn.Server,
) -> Iterator[str]:
    """Run `app` under uvicorn in a thread (on `host`:`port`, default a free port of loopback); yields its base URL
    (https with `tls`: a run's certificate and key, cluster/tls.py); stops it (lifespan included) on exit.
    `server_class`: the server to run (the coordinator's answers its long polls when it stops)."""
    port = free_port() if port is None else port
    certificate: dict[str, Any] = (
        {} if tls is None else {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
    )
    server = server_class(
        uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=1, **certificate)
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server thread died before the server started"
        return server.started

    wait_for(started, "the server to start", timeout_s=10, interval_s=0.01)
    try:
        yield f"{'http' if tls is None else 'https'}://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "server did not stop"
