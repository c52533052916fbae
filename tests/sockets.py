"""Raw-socket helpers for the tests of connection limits (chunk servers, the coordinator)."""

from __future__ import annotations

import socket


def closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    """True once the server closed `sock` (EOF after any response bytes) within `timeout_s`."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True
