"""Free TCP ports for the services the local cluster and the tests start.

A supervised service keeps its port across restarts (its URL is in the other services' settings), so
the port must stay free while the service is down. A port handed out by the kernel for `bind(port 0)`
comes from the ephemeral range (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by
default), which is also where every outgoing connection takes its local port: a keep-alive connection
of any process can hold a service's port while it restarts, and the restart then fails with
EADDRINUSE, again and again. So `free_port` hands out ports below that range, where only an explicit
bind takes them, and never the same one twice in a process (a random start, then in turn, each checked
free by binding it).
"""

from __future__ import annotations

import itertools
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

LOWEST_PORT = 10_000  # below: the well-known and registered ports of common servers
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32_768, 60_999)  # Linux's default; IANA's (macOS, Windows) starts at 49152


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """(lowest, highest) local port the kernel gives outgoing connections and port-0 binds."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def service_port_pool(ephemeral: tuple[int, int]) -> range:
    """The ports `free_port` draws from: below the ephemeral range, else above it, else (a machine whose
    ephemeral range covers nearly everything) all unprivileged ports."""
    low, high = ephemeral
    if low - LOWEST_PORT >= 1_000:
        return range(LOWEST_PORT, low)
    if 65_535 - high >= 1_000:
        return range(high + 1, 65_536)
    return range(1_024, 65_536)


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _candidates() -> Iterator[int]:
    pool = service_port_pool(ephemeral_port_range())
    start = random.randrange(len(pool))
    return itertools.cycle([*pool[start:], *pool[:start]])


_lock = threading.Lock()
_next_candidate: Iterator[int] | None = None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range, not handed out before by this process."""
    global _next_candidate
    with _lock:
        if _next_candidate is None:
            _next_candidate = _candidates()
        for port in itertools.islice(_next_candidate, 2_000):
            if is_free(port, host):
                return port
    raise OSError(f"no free port among 2000 tried outside the ephemeral range on {host}")
