"""Pipelined relay over real chunk servers (shared/weight_channel/relay_fetch.py): a chain relays while the
learner is still publishing, bytes arrive identical everywhere, and corrupt, dead or stalled holders
are routed around."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.liars import FaultKind, TamperingStore
from shared.weight_channel import ChunkStore, Manifest, ManifestError, verify_signature
from shared.weight_channel.client import fetch_manifest
from shared.weight_channel.manifest import build_manifest
from shared.weight_channel.relay_fetch import RelayFetcher, RelayFetchError
from shared.weight_channel.store import ManifestMismatchError
from tests import relay_holders
from tests.corrupting_store import CorruptingStore
from tests.polling import wait_for
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration

CHUNK_SIZE_BYTES = 64 * 1024
NUM_CHUNKS = 16


STORE_EVENTS = itertools.count()  # one sequence across every store of the test process: a logical clock


class OrderedStore(ChunkStore):
    """Records when each chunk was stored, as a position in STORE_EVENTS (to show that relaying
    overlaps receiving: an order of events, not a reading of the wall clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.stored_at: dict[int, int] = {}

    def commit_chunk(self, manifest: Manifest, index: int) -> None:  # every chunk held goes through here
        super().commit_chunk(manifest, index)
        self.stored_at[index] = next(STORE_EVENTS)


class Holder(relay_holders.Holder):
    """A holder whose store records the order chunks arrive in (OrderedStore) unless given one."""

    def __init__(self, store: ChunkStore | None = None, *, wait_s: float = 5.0, stall_timeout_s: float = 5.0) -> None:
        super().__init__(store if store is not None else OrderedStore(), wait_s=wait_s, stall_timeout_s=stall_timeout_s)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    created: list[Holder] = []
    yield created
    for holder in created:
        holder.close()


def new_version(policy_version: int = 1) -> tuple[Manifest, list[bytes], bytes]:
    blob = np.random.default_rng(policy_version).bytes(NUM_CHUNKS * CHUNK_SIZE_BYTES - 1000)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=policy_version, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    return manifest, chunks, blob


def publish_slowly(
    store: ChunkStore, manifest: Manifest, chunks: list[bytes], interval_s: float = 0.05
) -> threading.Thread:
    """The learner's side while it is still publishing (or its own upload is slow): chunk after chunk.
    The pause between chunks is the slowness being simulated, not a wait for anything."""
    store.add_manifest(manifest)

    def trickle() -> None:
        for index, chunk in enumerate(chunks):
            time.sleep(interval_s)
            store.put_chunk(manifest.policy_version, index, chunk)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    return thread


def test_a_chain_of_relays_pipelines_and_every_receiver_holds_identical_bytes(holders: list[Holder]) -> None:
    learner, a, b, c = (Holder() for _ in range(4))
    holders += [learner, a, b, c]
    manifest, chunks, blob = new_version()
    publishing = publish_slowly(learner.store, manifest, chunks)
    for child, parent in ((a, learner), (b, a), (c, b)):
        child.fetch_in_background(manifest, [parent.url, learner.url])

    results = [a.done(), b.done(), c.done()]
    publishing.join()

    for holder, result in zip((a, b, c), results, strict=True):
        assert result.blob == blob and holder.store.is_complete(1)
        assert result.num_corrupt_chunks == 0 and result.failures == []
    # each receiver got every byte from its parent alone: the learner uploaded one copy
    assert results[0].bytes_by_source == {learner.url: len(blob)}
    assert results[1].bytes_by_source == {a.url: len(blob)}
    assert results[2].bytes_by_source == {b.url: len(blob)}
    # pipelined: the end of the chain had its first chunk before the learner had its last
    assert c.store.stored_at[0] < learner.store.stored_at[NUM_CHUNKS - 1]
    with httpx.Client() as client:  # and serves it on: byte-identical over HTTP too
        assert client.get(f"{c.url}/v1/weights/1/chunks/7").content == chunks[7]


def test_a_corrupt_chunk_from_a_relay_is_caught_and_refetched_from_another_holder(holders: list[Holder]) -> None:
    manifest, chunks, blob = new_version()
    learner, bad_relay = Holder(), Holder(CorruptingStore(corrupt_index=2))
    child, grandchild = Holder(), Holder()
    holders += [learner, bad_relay, child, grandchild]
    learner.store.put_version(manifest, chunks)
    bad_relay.store.put_version(manifest, chunks)  # it holds verified chunks, but serves chunk 2 flipped

    child.fetch_in_background(manifest, [bad_relay.url, learner.url])
    grandchild.fetch_in_background(manifest, [child.url, learner.url])
    relayed, downstream = child.done(), grandchild.done()

    assert relayed.blob == blob and downstream.blob == blob
    assert relayed.corrupt_by_source == {bad_relay.url: 1}
    assert relayed.bytes_by_source[learner.url] == CHUNK_SIZE_BYTES  # only chunk 2 came from the learner
    assert relayed.bytes_by_source[bad_relay.url] == len(blob)  # the corrupt copy was received, never stored
    # the child may have forwarded the bad copy of chunk 2 (cut-through) before its check failed: it then
    # said so (the verdict byte), so the grandchild refetched that chunk from it and blamed nobody
    assert downstream.num_corrupt_chunks == 0 and downstream.failures == []
    num_rejected = downstream.rejected_by_source[child.url]
    assert num_rejected <= 1
    assert downstream.bytes_by_source == {child.url: len(blob) + num_rejected * CHUNK_SIZE_BYTES}


@pytest.mark.parametrize("kind", [FaultKind.CORRUPT_CHUNKS, FaultKind.FORGED_MANIFEST])
def test_a_lying_workers_store_serves_lies_its_children_refuse(holders: list[Holder], kind: FaultKind) -> None:
    """The fault suite's lying relay (benchmarks/liars.py): it holds the learner's verified chunks but
    serves every one flipped, and with forged_manifest a manifest of its own for them; a child pins the
    learner's manifest, refuses the flipped chunks and gets the version whole from the learner."""
    manifest, chunks, blob = new_version()
    liar_store = TamperingStore(kind, keep_versions=4, trusted_key=PUBLIC_KEY, spill_dir=None)
    learner, liar, child = Holder(), Holder(liar_store), Holder()
    holders += [learner, liar, child]
    learner.store.put_version(manifest, chunks)
    liar.store.put_version(manifest, chunks)
    assert liar_store.chunks(manifest) == chunks  # what the liar itself would load is the real thing

    served = httpx.get(f"{liar.url}/v1/weights/1/manifest").content
    if kind == FaultKind.FORGED_MANIFEST:
        with httpx.Client() as client, pytest.raises(ManifestError, match="signed by key"):
            fetch_manifest(client, liar.url, 1, PUBLIC_KEY)
        forged = Manifest.from_json(served)
        verify_signature(forged, liar_store.forging_key.public_key())  # a consistent forgery, by another key
        assert forged.chunk_digests != manifest.chunk_digests
    else:
        assert Manifest.from_json(served) == manifest

    child.fetch_in_background(manifest, [liar.url, learner.url])
    fetched = child.done()

    assert fetched.blob == blob
    assert fetched.corrupt_by_source == {liar.url: 2}  # two bad chunks and the liar is dropped for this version
    assert fetched.failures == [f"{liar.url}: sent 2 corrupt chunks"]


RELAY_PROGRAM = """
import sys
from shared.weight_channel import ChunkServer, ChunkStore, Manifest
from shared.weight_channel.relay_fetch import RelayFetcher

manifest = Manifest.from_json(sys.stdin.readline())
store = ChunkStore()
server = ChunkServer(store, wait_s=5.0).start()
print(server.url, flush=True)
RelayFetcher(store, own_url=server.url).fetch(manifest, lambda: [sys.argv[1]])
sys.stdin.read()  # keep relaying until the test closes stdin (or kills the process)
"""


def test_a_parent_killed_mid_broadcast_is_replaced_and_every_other_worker_completes(
    holders: list[Holder], repo_root: Path
) -> None:
    manifest, chunks, blob = new_version()
    learner, child, grandchild = Holder(), Holder(), Holder()
    holders += [learner, child, grandchild]
    parent = subprocess.Popen(
        [sys.executable, "-c", RELAY_PROGRAM, learner.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo_root,
    )
    try:
        parent.stdin.write(manifest.to_json().decode() + "\n")
        parent.stdin.flush()
        parent_url = parent.stdout.readline().strip()
        # publishing starts once the parent is up (its start-up, imports included, takes longer than the
        # whole publication on a busy machine); the learner's server waits for the manifest meanwhile
        publishing = publish_slowly(learner.store, manifest, chunks, interval_s=0.1)
        child.fetch_in_background(manifest, [parent_url, learner.url])  # the plan: parent, then the learner
        grandchild.fetch_in_background(manifest, [child.url, parent_url, learner.url])
        wait_for(
            lambda: len(child.store.missing_chunks(manifest)) <= NUM_CHUNKS - 3,
            "the child to receive from its parent",
            timeout_s=20,
            interval_s=0.01,
        )
        assert len(learner.store.missing_chunks(manifest)) > 0  # mid-broadcast
        parent.kill()  # SIGKILL: no goodbye
        parent.wait(timeout=10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    relayed, downstream = child.done(), grandchild.done()
    publishing.join()

    assert relayed.blob == blob and downstream.blob == blob
    assert relayed.bytes_by_source[parent_url] >= 3 * CHUNK_SIZE_BYTES  # it did relay, then it died
    assert relayed.bytes_by_source[learner.url] > 0
    assert len(relayed.failures) == 1 and relayed.failures[0].startswith(parent_url)
    assert downstream.bytes_by_source == {child.url: len(blob)}  # the grandchild never noticed


def test_a_stalled_parent_is_replaced_after_the_stall_timeout(holders: list[Holder]) -> None:
    manifest, chunks, blob = new_version()
    # the stalled holder would keep the stream open for 60 s, longer than done() waits for the fetch (30 s):
    # only the child's own stall timeout (0.5 s) can end it in time
    learner, stalled, child = Holder(), Holder(wait_s=60.0), Holder(stall_timeout_s=0.5)
    holders += [learner, stalled, child]
    learner.store.put_version(manifest, chunks)
    stalled.store.add_manifest(manifest)  # it announced the version and never receives a chunk

    child.fetch_in_background(manifest, [stalled.url, learner.url])
    result = child.done(timeout_s=30.0)

    assert result.blob == blob and result.bytes_by_source == {learner.url: len(blob)}
    # "stalled": the child's read timed out; a holder giving up would have ended the stream short instead
    assert "stalled" in result.failures[0] and result.failures[0].startswith(stalled.url)


def test_when_every_holder_fails_the_error_names_each_of_them(holders: list[Holder]) -> None:
    manifest, _, _ = new_version()
    nobody = Holder()
    holders.append(nobody)
    fetcher = RelayFetcher(ChunkStore(), stall_timeout_s=0.5, manifest_wait_s=0.1, version_timeout_s=10.0)
    try:
        with pytest.raises(RelayFetchError) as caught:
            fetcher.fetch(manifest, lambda: [nobody.url, "http://127.0.0.1:9"])
    finally:
        fetcher.close()
    message = str(caught.value)
    assert f"{nobody.url}: stream 1/full" in message and "404" in message  # it never heard of the version
    assert "http://127.0.0.1:9" in message and "ConnectionRefused" in message


def test_a_store_replaces_a_version_whose_manifest_differs_and_pins_requests_to_a_manifest(
    holders: list[Holder],
) -> None:
    holder = Holder()
    holders.append(holder)
    old, old_chunks, _ = new_version(1)
    holder.store.put_version(old, old_chunks)
    blob = b"a restarted learner re-used version number 1" * 2000
    new, new_chunks = build_manifest(
        blob, run_id="r", policy_version=1, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )

    holder.store.put_version(new, new_chunks)

    assert holder.store.manifest(1) == new and holder.store.is_complete(1)
    assert holder.store.missing_chunks(old) == list(range(old.num_chunks))
    with pytest.raises(ManifestMismatchError):
        holder.store.get_chunk(1, 0, manifest_sha256=old.sha256())
    with httpx.Client() as client:
        assert client.get(f"{holder.url}/v1/weights/1/full/chunks/0?manifest={old.sha256()}").status_code == 409
        assert client.get(f"{holder.url}/v1/weights/1/full/chunks/0?manifest={new.sha256()}").content == new_chunks[0]


class DribblingHolder:
    """Issue 23, attack 7 on the child's side: a holder that answers a stream with 200 and then one byte every
    `interval_s`, never long enough silent for a read to time out (the pauses are the attack simulated)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stopping = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._dribble, args=(connection,), daemon=True).start()

    def _dribble(self, connection: socket.socket) -> None:
        with connection:
            connection.recv(65536)  # the request
            try:
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                while not self._stopping.wait(self.interval_s):
                    connection.sendall(b"\0")
            except OSError:  # the child left
                return

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()


def test_a_parent_sending_a_byte_now_and_then_is_left_after_the_stall_timeout(holders: list[Holder]) -> None:
    """A read never times out on a holder that sends a byte every 0.1 s; the stream guard leaves it after
    stall_timeout_s (0.5 s), its rate far too low to finish by the relay deadline (or, were its bytes not
    handed up one by one, no read returning for that long), and the learner serves the version."""
    manifest, chunks, blob = new_version()
    learner, child = Holder(), Holder(stall_timeout_s=0.5)
    holders += [learner, child]
    learner.store.put_version(manifest, chunks)
    dribbler = DribblingHolder(interval_s=0.1)
    try:
        started_s = time.monotonic()
        child.fetch_in_background(manifest, [dribbler.url, learner.url])
        result = child.done(timeout_s=30.0)
        elapsed_s = time.monotonic() - started_s
    finally:
        dribbler.close()

    assert result.blob == blob and result.bytes_by_source == {learner.url: len(blob)}
    assert result.failures[0].startswith((f"{dribbler.url}: too slow", f"{dribbler.url}: stalled"))
    assert (result.parent_url, result.parent_bytes) == (dribbler.url, 0)  # what its swap report will say
    assert elapsed_s < 2 * 0.5 + 5.0  # the bound (2 x stall_timeout_s) plus the learner's transfer, with slack


def test_worker_sources_get_half_the_version_timeout_and_the_learner_the_rest(holders: list[Holder]) -> None:
    """A worker sending whole pieces, each just inside the stall timeout, is too slow to finish by the relay
    deadline (version_timeout_s / 2): it is left at its first piece after stall_timeout_s."""
    manifest, chunks, blob = new_version()
    learner, slow = Holder(), Holder()
    holders += [learner, slow]
    learner.store.put_version(manifest, chunks)
    receiving = publish_slowly(slow.store, manifest, chunks, interval_s=0.3)  # 16 chunks: ~5 s
    fetcher = RelayFetcher(ChunkStore(), stall_timeout_s=1.0, manifest_wait_s=1.0, version_timeout_s=4.0)
    try:
        result = fetcher.fetch(manifest, lambda: [slow.url, learner.url])
    finally:
        fetcher.close()
    receiving.join()

    assert result.blob == blob and result.bytes_by_source[learner.url] > 0
    assert result.failures[0].startswith(f"{slow.url}: too slow") and result.seconds < 4.0
