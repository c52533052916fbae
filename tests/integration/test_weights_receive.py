"""The weight path in one pass each way (issue 11), against real chunk servers, real Redis and a real
torch engine: the learner serialises into the buffer it serves from and its chunks are not hashed a
second time; a receiver's chunks land verified in their place, in memory or in the safetensors file a
vLLM-style engine loads by path; a corrupt chunk never becomes servable."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from engines.torch_engine import TorchEngine
from services.learner.publish import publication_state, serialize_weights
from services.rollout.announcement_client import StreamAnnouncements
from services.rollout.weights_sync import WeightsSync
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.weight_channel import Buffer, ChunkServer, ChunkStore, VerifiedVersion, WeightFollower, WeightPublisher
from shared.weight_channel.client import fetch_manifest
from shared.weight_channel.manifest import ChunkVerificationError, build_manifest
from shared.weight_channel.protocol import STREAM_VERIFIED
from shared.weight_channel.relay_fetch import RelayFetcher
from tests.polling import wait_for
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

CHUNK_SIZE_BYTES = 16 * 1024


class FileLoadingEngine(TorchEngine):
    """A torch engine that, like vLLM, loads from the file it is given when there is one: records what it
    got, and that the file held exactly the verified bytes when it was loaded."""

    def __init__(self, model_dir: Path, weights_dir: Path) -> None:
        super().__init__(model_dir)
        self.weights_dir = weights_dir
        self.loaded_from: list[Path | None] = []

    def load_weights(self, safetensors_bytes: Buffer, policy_version: int, path: Path | None = None) -> None:
        self.loaded_from.append(path)
        if path is not None:
            assert path.read_bytes() == bytes(safetensors_bytes)
            tensors = load_file(path)  # the safetensors library itself reads the received file
            self.model.load_state_dict(tensors, strict=False)
            self._policy_version = policy_version
            return
        super().load_weights(safetensors_bytes, policy_version)


@pytest.fixture
def publisher(bus: StreamBus, keys: RunKeys, tmp_path: Path) -> Iterator[WeightPublisher]:
    store = ChunkStore(keep_versions=4, spill_dir=tmp_path / "published")
    server = ChunkServer(store, wait_s=1.0).start()
    publisher = WeightPublisher(
        bus, keys, store, public_url=server.url, signing_key=SIGNING_KEY, chunk_size_bytes=CHUNK_SIZE_BYTES
    )
    yield publisher
    publisher.close()
    server.stop()


def perturbed(engine: TorchEngine, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in engine.model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return engine.model


def test_the_learner_publishes_without_hashing_its_chunks_twice(
    publisher: WeightPublisher, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_second_pass(*_: object, **__: object) -> list[str]:
        raise AssertionError("the store re-hashed chunks the learner had just hashed")

    monkeypatch.setattr("shared.weight_channel.store.chunk_digests", no_second_pass)
    model = TorchEngine(model_dir).model
    published = publisher.publish(publication_state(model), policy_version=0)

    blob = serialize_weights(model)
    manifest, _ = build_manifest(
        blob,
        run_id=published.manifest.run_id,
        policy_version=0,
        chunk_size_bytes=CHUNK_SIZE_BYTES,
        signing_key=SIGNING_KEY,
    )
    assert published.manifest.chunk_digests == manifest.chunk_digests  # the digests of the bytes served
    assert bytes(publisher.store.payload(published.manifest)) == blob
    file_path = publisher.store.file_path(published.manifest)
    assert file_path is not None and file_path.read_bytes() == blob  # serialised straight into its file


def test_a_received_version_lands_in_the_file_the_engine_loads_by_path(
    publisher: WeightPublisher, bus: StreamBus, model_dir: Path, tmp_path: Path
) -> None:
    source = TorchEngine(model_dir)
    engine = FileLoadingEngine(model_dir, tmp_path / "engine-weights")
    # as the worker builds it for an engine with a weights_dir: full versions are received into files there
    store = ChunkStore(keep_versions=1, spill_dir=engine.weights_dir, trusted_key=PUBLIC_KEY)
    ready: list[VerifiedVersion] = []
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(store, PUBLIC_KEY, run_id=bus.keys.run_id),
        retry_failed_after_s=0.0,
        on_ready=ready.append,
    )
    try:
        published = publisher.publish(publication_state(perturbed(source, seed=1)), policy_version=1)
        sync.start()
        wait_for(lambda: ready, "version 1 ready", timeout_s=20.0)
        version = ready[0]
        assert version.path is not None and version.path.parent == engine.weights_dir
        assert version.ready_at_s >= version.transfer_done_at_s >= version.fetch_started_at_s > 0
        received = store.file_path(published.manifest)
        assert received is not None and received.read_bytes() == serialize_weights(source.model)

        publisher.publish(
            publication_state(perturbed(source, seed=2)), policy_version=2
        )  # evicts version 1 from the store
        wait_for(lambda: len(ready) == 2, "version 2 ready", timeout_s=20.0)
        assert store.versions() == [2] and not received.exists()  # the store's own file went with the eviction...
        assert sync.update(engine) == 2  # ...the newest ready version loads, from its file
        assert engine.loaded_from[-1] is not None and engine.policy_version == 2
        assert not engine.loaded_from[-1].exists()  # the engine's link is gone once loaded
        assert not version.path.exists()  # and so is the link of version 1, replaced before it was loaded
        expected = source.model.state_dict()
        assert all(torch.equal(expected[name], tensor) for name, tensor in engine.model.state_dict().items())
    finally:
        sync.close()


def test_a_corrupt_chunk_is_verified_in_place_and_never_becomes_servable() -> None:
    blob = os.urandom(3 * CHUNK_SIZE_BYTES + 5)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=0, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    store = ChunkStore(trusted_key=PUBLIC_KEY)
    server = ChunkServer(store, wait_s=0.2).start()
    try:
        store.add_manifest(manifest)
        region = store.receive_region(manifest, 1)
        region[:] = bytes(chunks[1])[:-1] + b"\x00"
        with pytest.raises(ChunkVerificationError, match="chunk 1"):
            store.commit_chunk(manifest, 1)
        assert store.missing_chunks(manifest) == [0, 1, 2, 3]
        with httpx.Client() as client:  # not served: the child waits, then is told it is missing
            assert client.get(f"{server.url}/v1/weights/0/chunks/1").status_code == 504
        region[:] = chunks[1]
        store.commit_chunk(manifest, 1)
        with pytest.raises(ValueError, match="already held"):  # a held region is never written again
            store.receive_region(manifest, 1)
        for index in (0, 2, 3):
            store.put_chunk(0, index, chunks[index])
        assert bytes(store.payload(manifest)) == blob
    finally:
        server.stop()


def test_a_relayed_payload_is_one_buffer_and_served_on_byte_identical(chunk_server: ChunkServer) -> None:
    blob = os.urandom(5 * CHUNK_SIZE_BYTES + 123)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=3, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    chunk_server.store.put_version(manifest, blob)
    relay_store = ChunkStore(trusted_key=PUBLIC_KEY)
    relay = ChunkServer(relay_store).start()
    fetcher = RelayFetcher(relay_store, own_url=relay.url)
    try:
        fetched = fetcher.fetch(manifest, lambda: [chunk_server.url])
        assert fetched.blob == blob and fetched.num_bytes == len(blob)
        views = relay_store.chunks(manifest)
        assert all(view.obj is views[0].obj for view in views)  # every chunk in one buffer: nothing to join
        with httpx.Client() as client:
            assert fetch_manifest(client, relay.url, 3, PUBLIC_KEY) == manifest
            streamed = client.get(f"{relay.url}/v1/weights/3/full/stream").content
        # each chunk is followed by its verdict byte: 1, the relay verified exactly those bytes
        assert streamed == b"".join(bytes(chunk) + STREAM_VERIFIED for chunk in chunks)
    finally:
        fetcher.close()
        relay.stop()


def test_a_holder_that_went_the_full_way_says_at_once_it_has_no_delta(chunk_server: ChunkServer) -> None:
    # a parent without the base fetched version 4 full: its children asking for the delta are told "not
    # here" instead of waiting chunk_wait_s for a delta that never comes (they move to the next holder)
    blob = os.urandom(2 * CHUNK_SIZE_BYTES)
    manifest, _ = build_manifest(
        blob, run_id="r", policy_version=4, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    store = chunk_server.store
    answers: list[object] = []
    waiting = threading.Thread(target=lambda: answers.append(store.wait_for_manifest(4, "delta", None, 3600.0)))
    waiting.start()  # nothing of version 4 yet: this waits, as a child's stream request does
    store.put_version(manifest, blob)
    waiting.join(timeout=30.0)
    assert answers == [None] and not waiting.is_alive()
    with httpx.Client(timeout=30.0) as client:
        response = client.get(f"{chunk_server.url}/v1/weights/4/delta/stream?wait_manifest_s=3600")
    assert response.status_code == 404


def test_a_holder_of_a_newer_version_says_at_once_it_will_not_hold_an_older_one(chunk_server: ChunkServer) -> None:
    # a worker back from a partition asks for the version it was cut off in; a holder that has moved on will
    # never hold it (versions arrive newest-last): it answers at once, so the worker moves to the newest version
    blob = os.urandom(2 * CHUNK_SIZE_BYTES)
    manifest, _ = build_manifest(
        blob, run_id="r", policy_version=9, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    store = chunk_server.store
    store.put_version(manifest, blob)
    with httpx.Client(timeout=30.0) as client:
        for payload in ("full", "delta"):
            response = client.get(f"{chunk_server.url}/v1/weights/5/{payload}/stream?wait_manifest_s=3600")
            assert response.status_code == 404, payload
    # a version newer than every held one is still waited for (it may come): here, until the short wait ends
    assert store.wait_for_manifest(10, "full", None, 0.2) is None
    answers: list[object] = []
    waiting = threading.Thread(target=lambda: answers.append(store.wait_for_manifest(10, "full", None, 3600.0)))
    waiting.start()
    newer, _ = build_manifest(
        blob, run_id="r", policy_version=10, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    store.put_version(newer, blob)
    waiting.join(timeout=30.0)
    assert answers == [newer]


def test_two_workers_fetching_from_each_other_break_the_cycle_at_once(chunk_server: ChunkServer) -> None:
    # successive relay plans can make A the parent of B and B the parent of A for one version: each streams
    # from the other and neither holds a byte. Each names itself in its request, so each tells the other at
    # once that its copy comes from the asker; both move to their next source (the learner) instead of
    # waiting the holders' wait (60 s here; a fetcher's read gives up after 30) for progress that cannot come
    blob = os.urandom(3 * CHUNK_SIZE_BYTES)
    manifest, _ = build_manifest(
        blob, run_id="r", policy_version=6, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    chunk_server.store.put_version(manifest, blob)
    stores = [ChunkStore(trusted_key=PUBLIC_KEY), ChunkStore(trusted_key=PUBLIC_KEY)]
    servers = [ChunkServer(store, wait_s=60.0).start() for store in stores]
    fetchers = [
        RelayFetcher(store, own_url=server.url, stall_timeout_s=30.0)
        for store, server in zip(stores, servers, strict=True)
    ]
    results: dict[int, object] = {}

    def fetch(me: int) -> None:
        other = servers[1 - me].url
        results[me] = fetchers[me].fetch(manifest, lambda: [other, chunk_server.url], manifest_wait_s=60.0)

    threads = [threading.Thread(target=fetch, args=(me,)) for me in (0, 1)]
    try:
        started_s = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120.0)
        elapsed_s = time.monotonic() - started_s
        assert not any(thread.is_alive() for thread in threads)
        assert all(stores[me].payload(manifest) == blob for me in (0, 1))
        assert elapsed_s < 5.0, f"the cycle cost {elapsed_s:.1f}s: the holders waited on each other"
    finally:
        for server in servers:
            server.stop()
