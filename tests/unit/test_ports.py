"""Service ports come from outside the kernel's ephemeral range, so no outgoing connection can hold a
supervised service's port while it restarts (cluster/ports.py)."""

from __future__ import annotations

import socket
from pathlib import Path

from cluster.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    LOWEST_PORT,
    ephemeral_port_range,
    free_port,
    is_free,
    service_port_pool,
)


def test_the_ephemeral_range_is_read_from_the_kernel_file_with_a_default(tmp_path: Path) -> None:
    kernel_file = tmp_path / "ip_local_port_range"
    kernel_file.write_text("40000\t50000\n")
    assert ephemeral_port_range(kernel_file) == (40_000, 50_000)
    assert ephemeral_port_range(tmp_path / "absent") == DEFAULT_EPHEMERAL_RANGE
    kernel_file.write_text("garbage\n")
    assert ephemeral_port_range(kernel_file) == DEFAULT_EPHEMERAL_RANGE


def test_the_pool_lies_below_the_ephemeral_range_else_above_it() -> None:
    assert service_port_pool((32_768, 60_999)) == range(LOWEST_PORT, 32_768)
    assert service_port_pool((10_500, 60_000)) == range(60_001, 65_536)
    assert service_port_pool((1_024, 65_000)) == range(1_024, 65_536)


def test_free_ports_are_outside_the_ephemeral_range_and_never_repeat() -> None:
    low, high = ephemeral_port_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(not low <= port <= high for port in ports)
    assert all(is_free(port) for port in ports)


def test_an_outgoing_connection_never_holds_a_port_handed_out() -> None:
    """The failure this prevents: a connection's local port equal to a service's port makes the
    service's (re)start fail with EADDRINUSE."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        clients = [socket.create_connection(listener.getsockname()) for _ in range(50)]
        try:
            taken = {client.getsockname()[1] for client in clients}
            assert all(not is_free(port) for port in taken)  # a connection's local port cannot be bound
            assert taken.isdisjoint(free_port() for _ in range(200))
        finally:
            for client in clients:
                client.close()


def test_a_listening_port_is_not_free() -> None:
    with socket.create_server(("127.0.0.1", free_port())) as listener:
        assert not is_free(listener.getsockname()[1])
