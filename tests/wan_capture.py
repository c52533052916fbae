"""A packet capture of the WAN testbed's links, for tests: every frame that crosses a node's veth (seen on its
far end, in the root namespace), searched as it arrives for byte strings that must never cross in clear text.
Frames are not kept, only counts and hits, so a long run costs no memory."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

ETH_P_ALL = 0x0003
TLS_APPLICATION_DATA = b"\x17\x03\x03"  # a TLS 1.2/1.3 application-data record header


@dataclass
class LinkCapture:
    interface_prefix: str  # the testbed's veth ends (e.g. "rlw"): every node's link
    needles: dict[str, bytes]  # name -> bytes that must not appear
    hits: dict[str, int] = field(default_factory=dict)
    num_frames: int = 0
    num_bytes: int = 0
    num_tls_records: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> LinkCapture:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024 * 1024)
        sock.settimeout(0.2)
        self.thread = threading.Thread(target=self.capture, args=(sock,), daemon=True, name="link-capture")
        self.thread.start()
        return self

    def capture(self, sock: socket.socket) -> None:
        with sock:
            while not self.stopping.is_set():
                try:
                    frame, address = sock.recvfrom(65536)
                except TimeoutError:
                    continue
                if not address[0].startswith(self.interface_prefix) or address[2] == socket.PACKET_OUTGOING:
                    continue  # another interface, or the copy of a frame this end sends (counted where received)
                self.num_frames += 1
                self.num_bytes += len(frame)
                self.num_tls_records += frame.count(TLS_APPLICATION_DATA)
                for name, needle in self.needles.items():
                    if needle in frame:
                        self.hits[name] = self.hits.get(name, 0) + 1

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
