"""A TCP forwarder that records every byte it passes, both ways: what anyone on the path between a client and a
server captures (tests of what crosses the network in clear text, docs/threat_model.md#tls).

    with RecordingProxy(("127.0.0.1", server_port)) as proxy:       # listens on 127.0.0.1, a free port
        client.get(f"https://127.0.0.1:{proxy.port}/...")            # the client talks through it
    assert b"secret" not in proxy.captured()

It relays bytes as they come, one thread per direction and connection, never parsing them (TLS passes through
untouched, so the client's handshake is with the server). `listen_host` may be any local address (a network
namespace's, to capture on a real link); `upstream` any address this process reaches.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from types import TracebackType

CHUNK_BYTES = 65_536


@dataclass
class Stream:
    """One direction of one connection: the bytes in the order they passed."""

    data: bytearray = field(default_factory=bytearray)


class RecordingProxy:
    def __init__(self, upstream: tuple[str, int], *, listen_host: str = "127.0.0.1", listen_port: int = 0) -> None:
        self.upstream = upstream
        self._listener = socket.create_server((listen_host, listen_port))
        self._listener.settimeout(0.1)  # the accept loop looks at the stop flag this often
        self.host, self.port = self._listener.getsockname()[:2]
        self.client_to_server: list[Stream] = []  # per connection, in the order they were accepted
        self.server_to_client: list[Stream] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._accepter.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    @property
    def num_connections(self) -> int:
        with self._lock:
            return len(self.client_to_server)

    def captured(self) -> bytes:
        """Every byte that passed, both directions of every connection."""
        with self._lock:
            return b"".join(bytes(stream.data) for stream in (*self.client_to_server, *self.server_to_client))

    def sent_by_clients(self) -> bytes:
        with self._lock:
            return b"".join(bytes(stream.data) for stream in self.client_to_server)

    def close(self) -> None:
        """Stop accepting, close every connection, join the threads."""
        self._stop.set()
        if self._accepter.is_alive():
            self._accepter.join(timeout=5)
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            sock.close()
        for thread in threads:
            thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()  # the client sees the connection refused, as it would without the proxy
                continue
            server.settimeout(None)
            up, down = Stream(), Stream()
            with self._lock:
                self.client_to_server.append(up)
                self.server_to_client.append(down)
                self._sockets += [client, server]
                for source, sink, stream in ((client, server, up), (server, client, down)):
                    thread = threading.Thread(target=self._pump, args=(source, sink, stream), daemon=True)
                    self._threads.append(thread)
                    thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, stream: Stream) -> None:
        """Relay `source` to `sink`, recording each piece before it goes on; at EOF pass the half-close on."""
        try:
            while chunk := source.recv(CHUNK_BYTES):
                with self._lock:
                    stream.data += chunk
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # the other side (or close()) ended the connection
            for sock in (source, sink):
                sock.close()
