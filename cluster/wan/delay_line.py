"""python -m cluster.wan.delay_line TABLE.json: the latency of one node's links, in user space.

This kernel's `tc` has no `netem`, so packets cannot be delayed in the kernel (cluster/wan/namespaces.py
caps the rates with `tbf`; nftables drops packets). Latency is added here instead: a transparent TCP
forwarder in the node's namespace. An nftables `redirect` rule sends every TCP connection the node opens
to another node of the testbed to this process's port; it reads the original destination
(SO_ORIGINAL_DST), connects there itself (its sockets carry MARK, which the rule lets through) and
forwards both directions, holding every piece it reads for the path's one-way delay:

    path RTT          = the node's rtt_ms + the destination node's rtt_ms (each profile's rtt is the
                        round trip to the core; the core's own is 0)
    connection set-up = one RTT: the client's connect() returns at once, but its first bytes leave only
                        after the modelled handshake (one RTT), and the forwarder connects to the
                        destination one one-way delay late (the SYN's trip), so the server's first
                        bytes reach the client one RTT after connect(), as they would
    each piece        = released at max(read + one-way delay + jitter, the previous piece's release):
                        a byte stream is never reordered, so jitter delays, it does not reorder
    window            = at most `window_bytes` read and not yet acknowledged (an acknowledgement takes
                        the way back: release + one-way delay), so one connection's throughput is
                        bounded by window / RTT as real TCP's is by its receive window

What it does not model: the TCP that carries the bytes runs on the short hop (forwarder <-> destination),
so a lost packet is retransmitted after that hop's microseconds, not after the path's RTT: throughput
under loss is therefore higher than a real long path's (docs/wan.md, "What the testbed models"). A
refused connection reaches the client as a reset after connect() succeeded, not as a connect error.
Connections inside the node (loopback, its own address) are not redirected and get no delay.

TABLE.json: {"listen_port": 15000, "mark": 21079, "rtt_ms": 30, "jitter_ms": 0, "window_bytes": 4194304,
"peer_rtt_ms": {"10.78.0.1": 0, "10.78.0.3": 180}}. Prints "listening" once it accepts connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import struct
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("delay-line")

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
READ_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 60.0  # a destination that drops our SYNs (a partition): give up on it after this


@dataclass(frozen=True)
class DelayTable:
    listen_port: int
    mark: int  # SO_MARK of the forwarder's own connections: the redirect rule lets them through
    rtt_ms: float  # this node's round trip to the core
    jitter_ms: float = 0.0  # each piece's delay varies uniformly within +- this (one way)
    window_bytes: int = 4 * 1024 * 1024
    peer_rtt_ms: dict[str, float] = field(default_factory=dict)  # another node's address -> its rtt_ms

    @classmethod
    def read(cls, path: Path) -> DelayTable:
        return cls(**json.loads(path.read_text()))

    def one_way_s(self, destination: str) -> float:
        return (self.rtt_ms + self.peer_rtt_ms.get(destination, 0.0)) / 2 / 1000


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where the client meant to connect before the redirect rule sent it here."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    (port,) = struct.unpack("!H", raw[2:4])
    return socket.inet_ntoa(raw[4:8]), port


@dataclass
class DelayedPipe:
    """One direction of a connection: pieces read from `source`, written to `sink` at their release time."""

    source: asyncio.StreamReader
    sink: asyncio.StreamWriter
    one_way_s: float
    jitter_s: float
    window_bytes: int
    not_before_s: float  # the modelled handshake's end: nothing is released earlier
    pieces: deque[tuple[float, bytes]] = field(default_factory=deque)
    unacknowledged: deque[tuple[float, int]] = field(default_factory=deque)  # (acknowledged at, bytes)
    num_unacknowledged_bytes: int = 0
    last_release_s: float = 0.0
    wake_writer: asyncio.Event = field(default_factory=asyncio.Event)
    source_done: bool = False

    async def run(self) -> None:
        await asyncio.gather(self.read_pieces(), self.write_pieces())

    async def read_pieces(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await self.source.read(READ_BYTES):
                now_s = loop.time()
                jitter_s = random.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
                release_s = max(max(now_s, self.not_before_s) + self.one_way_s + jitter_s, self.last_release_s)
                self.last_release_s = release_s
                self.pieces.append((release_s, data))
                self.unacknowledged.append((release_s + self.one_way_s, len(data)))
                self.num_unacknowledged_bytes += len(data)
                self.wake_writer.set()
                await self.wait_for_window()
        except (ConnectionError, OSError):
            pass
        finally:
            self.source_done = True
            self.wake_writer.set()

    async def wait_for_window(self) -> None:
        """Stop reading while a window's worth is unacknowledged (the sender then blocks, as TCP's does)."""
        loop = asyncio.get_running_loop()
        while self.num_unacknowledged_bytes >= self.window_bytes:
            acknowledged_at_s, num_bytes = self.unacknowledged[0]
            if acknowledged_at_s > loop.time():
                await asyncio.sleep(acknowledged_at_s - loop.time())
            self.unacknowledged.popleft()
            self.num_unacknowledged_bytes -= num_bytes

    async def write_pieces(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self.pieces:
                    if self.source_done:
                        break
                    self.wake_writer.clear()
                    await self.wake_writer.wait()
                    continue
                release_s, data = self.pieces.popleft()
                if release_s > loop.time():
                    await asyncio.sleep(release_s - loop.time())
                self.sink.write(data)
                await self.sink.drain()
            if self.sink.can_write_eof():
                self.sink.write_eof()  # half-close: the other direction may still be talking
        except (ConnectionError, OSError):
            self.source_done = True
            self.pieces.clear()


@dataclass
class DelayLine:
    table: DelayTable

    async def serve(self) -> None:
        server = await asyncio.start_server(self.handle, "0.0.0.0", self.table.listen_port, limit=READ_BYTES)
        print("listening", flush=True)
        async with server:
            await server.serve_forever()

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        accepted_s = loop.time()
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            destination, port = original_destination(client_writer.get_extra_info("socket"))
            one_way_s = self.table.one_way_s(destination)
            await asyncio.sleep(one_way_s)  # the SYN's trip
            upstream_reader, upstream = await asyncio.wait_for(
                self.connect(destination, port), timeout=CONNECT_TIMEOUT_S
            )
            upstream_writer = upstream
            handshake_done_s = accepted_s + 2 * one_way_s
            jitter_s = self.table.jitter_ms / 1000
            window_bytes = self.table.window_bytes
            outbound = DelayedPipe(client_reader, upstream, one_way_s, jitter_s, window_bytes, handshake_done_s)
            inbound = DelayedPipe(upstream_reader, client_writer, one_way_s, jitter_s, window_bytes, 0.0)
            await asyncio.gather(outbound.run(), inbound.run())
        except (TimeoutError, OSError) as exc:  # refused, unreachable, reset: the client sees a reset
            log.debug("connection failed: %s", exc)
            reset(client_writer)
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(ConnectionError, OSError):
                        await writer.wait_closed()

    async def connect(self, destination: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.table.mark)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (destination, port))
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock, limit=READ_BYTES)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), the nearest a forwarder that already accepted gets to a refusal."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m cluster.wan.delay_line TABLE.json\n{__doc__}")
    table = DelayTable.read(Path(sys.argv[1]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(DelayLine(table).serve())


if __name__ == "__main__":
    main()
