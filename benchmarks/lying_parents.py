"""Relay parents that lie about what they serve, FOR TESTS AND MEASUREMENT ONLY (issue 35, item 5): a
worker's chunk store whose serving reads lie, under an honest ChunkServer (so the lie goes out over the
real chunk protocol), while what the worker itself fetches and verifies goes through the honest methods it
inherits (receive_region, commit_chunk, payload): it holds the real weights and only its children see the
lie.

    other_version        every chunk it serves is the same chunk of another version it holds (the newest
                         other one, complete): bytes the learner signed, under the wrong manifest; its
                         verdict byte says "verified"
    stall_after_headers  answers a stream with 200 and its headers, then never sends a byte of the body
    partial_then_stall   serves the first PARTIAL_SHARE of the chunks of every version honestly (as fast as
                         it receives them), then sends nothing more

A stalled read ends when `release()` is called (the test or benchmark that made the store calls it before
stopping the server), never by itself. A single-chunk GET of a chunk it stalls on is held before its
headers instead (the store cannot reach the headers of that route); nothing in the tests asks it one.

Two more lie where a store cannot reach, so they speak HTTP by hand (HandWrittenParent), a byte every
DRIBBLE_INTERVAL_S: never silent long enough for a socket read to time out:
    dribbled_head        a status line, then a header a byte at a time, never ended
    disowned_repair      chunk 0 with the verdict "rejected" (its upstream failed it, it says), so the
                         child asks it first for the repair; the repair's body a byte at a time
Used by tests/integration/test_relay_liars.py and benchmarks/relay_liars.py.
"""

from __future__ import annotations

import itertools
import math
import socket
import threading
from collections.abc import Callable
from enum import StrEnum

from shared.signing import Ed25519PublicKey
from shared.weight_channel import ChunkStore, Manifest
from shared.weight_channel.manifest import Buffer, Payload
from shared.weight_channel.store import ReceivedBytes

PARTIAL_SHARE = 0.6  # partial_then_stall: the share of each version's chunks served before the stall
DRIBBLE_INTERVAL_S = 0.2  # a hand-written liar's pause between two bytes
# the verdict byte after a chunk that failed the sender's check (protocol.py's STREAM_REJECTED): written by
# hand, as a liar outside the weight channel would (only the weight channel imports the protocol)
DISOWNED = b"\x00"

Answer = Callable[[socket.socket, int, threading.Event], None]  # (connection, request number, stopping)


class ParentLie(StrEnum):
    OTHER_VERSION = "other_version"
    STALL_AFTER_HEADERS = "stall_after_headers"
    PARTIAL_THEN_STALL = "partial_then_stall"


class LyingParentStore(ChunkStore):
    """A ChunkStore (verified on the way in, like any worker's) that serves as `lie` says (module doc)."""

    def __init__(
        self,
        lie: ParentLie,
        *,
        honest_share: float = PARTIAL_SHARE,
        keep_versions: int = 4,
        trusted_key: Ed25519PublicKey | None = None,
    ) -> None:
        if not 0.0 <= honest_share <= 1.0:
            raise ValueError(f"honest_share must be within [0, 1], got {honest_share}")
        super().__init__(keep_versions=keep_versions, trusted_key=trusted_key)
        self.lie = lie
        self.honest_share = honest_share
        self._released = threading.Event()

    def num_honest_chunks(self, num_chunks: int) -> int:
        """Chunks of a version of `num_chunks` served before the stall (all of them: no stall)."""
        if self.lie == ParentLie.STALL_AFTER_HEADERS:
            return 0
        if self.lie == ParentLie.PARTIAL_THEN_STALL:
            return math.ceil(self.honest_share * num_chunks)
        return num_chunks

    def release(self) -> None:
        """End every stalled read now (they answer 'no progress': the stream ends short) and stall no more."""
        self._released.set()

    def get_chunk(
        self,
        policy_version: int,
        index: int,
        wait_s: float = 0.0,
        payload: Payload = "full",
        manifest_sha256: str | None = None,
    ) -> memoryview | None:
        if self._stalls_at(policy_version, payload, index):
            if wait_s > 0:
                self._released.wait()
            return None
        chunk = super().get_chunk(policy_version, index, wait_s, payload, manifest_sha256)
        if chunk is None or self.lie != ParentLie.OTHER_VERSION:
            return chunk
        lie = self._other_versions_chunk(policy_version, payload, index, len(chunk))
        return memoryview(lie) if lie is not None else chunk

    def wait_received(
        self, manifest: Manifest, index: int, offset: int, stall_s: float, requester_url: str = ""
    ) -> ReceivedBytes | None:
        """Cut-through: a chunk it stalls on never arrives; other_version waits for the real chunk to be held
        (so the lie is paced like the truth) and then has the server send it whole, through get_chunk."""
        if self._stalls_at(manifest.policy_version, manifest.payload, index):
            self._released.wait()
            return None
        if self.lie != ParentLie.OTHER_VERSION:
            return super().wait_received(manifest, index, offset, stall_s, requester_url)
        held = super().get_chunk(manifest.policy_version, index, stall_s, manifest.payload, manifest.sha256())
        return None if held is None else ReceivedBytes(held[offset:], 0, held=True)

    def _stalls_at(self, policy_version: int, payload: Payload, index: int) -> bool:
        if self._released.is_set():
            return False
        manifest = self.manifest(policy_version, payload)
        return manifest is not None and index >= self.num_honest_chunks(manifest.num_chunks)

    def _other_versions_chunk(self, policy_version: int, payload: Payload, index: int, length: int) -> bytes | None:
        """Chunk `index` of the newest other complete version held, cut or zero-padded to `length` bytes so
        the stream stays well-formed; None when no other version is held (nothing to lie with)."""
        others = [v for v in self.versions() if v != policy_version and self.is_complete(v, payload)]
        other = self.manifest(max(others), payload) if others else None
        if other is None:
            return None
        chunk = super().get_chunk(other.policy_version, min(index, other.num_chunks - 1), 0.0, payload)
        data = bytes(chunk) if chunk is not None else b""
        return (data + bytes(length))[:length]


class HandWrittenParent:
    """A parent that answers every request by hand: `answer(connection, request_number, stopping)` writes
    the response after the request is read (requests numbered from 0, in the order they connect). `close()`
    sets `stopping` (every answer must end once it is set) and stops listening."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stopping = threading.Event()
        threading.Thread(target=self._serve, name="hand-written-parent", daemon=True).start()

    def _serve(self) -> None:
        for request_number in itertools.count():
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._answer, args=(connection, request_number), daemon=True).start()

    def _answer(self, connection: socket.socket, request_number: int) -> None:
        with connection:
            connection.recv(65536)  # the request
            try:
                self.answer(connection, request_number, self._stopping)
            except OSError:  # the child left
                return

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()


def dribble(connection: socket.socket, stopping: threading.Event) -> None:
    """One byte every DRIBBLE_INTERVAL_S until `stopping` (the pauses are the attack, not a wait)."""
    while not stopping.wait(DRIBBLE_INTERVAL_S):
        connection.sendall(b"a")


def dribbled_head(connection: socket.socket, _: int, stopping: threading.Event) -> None:
    connection.sendall(b"HTTP/1.1 200 OK\r\nX-Padding: ")
    dribble(connection, stopping)


def disowned_repair(manifest: Manifest, first_chunk: Buffer) -> Answer:
    """The first request (the stream): chunk 0 (`first_chunk`) disowned, then nothing; every later one (the
    repair): a well-formed head and a body a byte at a time."""
    body_bytes = manifest.total_size_bytes + manifest.num_chunks  # each chunk and its verdict byte

    def answer(connection: socket.socket, request_number: int, stopping: threading.Event) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % body_bytes)
        if request_number == 0:
            connection.sendall(bytes(first_chunk) + DISOWNED)
            stopping.wait()
        else:
            dribble(connection, stopping)

    return answer
