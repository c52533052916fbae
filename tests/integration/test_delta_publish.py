"""Delta versions end to end: the learner's WeightPublisher announces deltas with a full snapshot every
K versions; workers (WeightsSync against real chunk servers and Redis) rebuild exactly the learner's
state dict, relay both payloads, and a worker without the base fetches the full payload: from a peer that
holds it (one that rebuilt it), else from the learner at once (peers holding only the delta say so)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from engines.torch_engine import TorchEngine
from services.learner.publish import publication_state
from services.learner.trainer import load_policy
from services.rollout.announcement_client import StreamAnnouncements
from services.rollout.weights_sync import WeightsSync
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.weight_channel import ChunkServer, ChunkStore, WeightFollower, WeightPublisher
from tests.relay_holders import Holder
from tests.weights_keys import FORGER_KEY, PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

FULL_EVERY = 3


@pytest.fixture
def learner_server() -> Iterator[ChunkServer]:
    server = ChunkServer(ChunkStore(keep_versions=8), wait_s=2.0).start()
    yield server
    server.stop()


@pytest.fixture
def worker_servers() -> Iterator[list[ChunkServer]]:
    servers: list[ChunkServer] = []
    yield servers
    for server in servers:
        server.stop()


def train_a_little(model: torch.nn.Module, seed: int) -> None:
    """Stands in for one optimizer step: every weight moves a little, most rows of the embedding not at all."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            step = 1e-3 * torch.randn(parameter.shape, generator=generator)
            if "embed_tokens" in name:
                step[4:] = 0  # tokens that were not sampled get no gradient
            parameter.add_(step)


def assert_same_weights(engine: TorchEngine, model: torch.nn.Module) -> None:
    loaded, expected = engine.model.state_dict(), model.state_dict()
    assert loaded.keys() == expected.keys()
    for name in expected:
        assert torch.equal(loaded[name], expected[name]), name


def new_worker(
    redis_client: redis.Redis,
    keys: RunKeys,
    model_dir: Path,
    servers: list[ChunkServer],
    parents=None,
    chunk_wait_s: float = 1.0,
) -> tuple[WeightsSync, TorchEngine]:
    store = ChunkStore(keep_versions=4)
    servers.append(ChunkServer(store, wait_s=2.0).start())
    sync = WeightsSync(
        StreamAnnouncements(StreamBus(redis_client, keys, service="rollout")),
        WeightFollower(
            store,
            PUBLIC_KEY,
            run_id=keys.run_id,
            parents=parents,
            own_url=servers[-1].url,
            chunk_wait_s=chunk_wait_s,
            stall_timeout_s=chunk_wait_s + 1.0,
        ),
        retry_failed_after_s=0.0,
    )
    return sync, TorchEngine(model_dir)


def test_deltas_rebuild_the_learners_exact_weights_and_late_joiners_get_the_full_payload(
    bus: StreamBus,
    keys: RunKeys,
    redis_client: redis.Redis,
    learner_server: ChunkServer,
    worker_servers: list[ChunkServer],
    tiny_policy_dir: Path,
    tmp_path: Path,
) -> None:
    model, _ = load_policy(tiny_policy_dir)
    publisher = WeightPublisher(
        bus,
        keys,
        learner_server.store,
        public_url=learner_server.url,
        signing_key=SIGNING_KEY,
        chunk_size_bytes=16384,
        full_every=FULL_EVERY,
        journal_path=tmp_path / "broadcast.jsonl",
    )
    first, first_engine = new_worker(redis_client, keys, tiny_policy_dir, worker_servers)
    first_url = worker_servers[-1].url
    # the second worker relays from the first: its plan names the first as parent, the learner last
    second, second_engine = new_worker(
        redis_client, keys, tiny_policy_dir, worker_servers, parents=lambda learner_url: [first_url]
    )

    payloads = []
    for version in range(5):
        if version:
            train_a_little(model, seed=version)
        published = publisher.publish(publication_state(model), version)
        payloads.append(published.manifest.payload)
        assert first.update(first_engine) == version and second.update(second_engine) == version
        assert_same_weights(first_engine, model)
        assert_same_weights(second_engine, model)
        assert second.last_swap is not None and second.last_swap.source_url == first_url
        assert second.last_swap.num_bytes == published.manifest.total_size_bytes

    assert payloads == ["full", "delta", "delta", "full", "delta"]  # a full snapshot every K = 3
    journal = [json.loads(line) for line in (tmp_path / "broadcast.jsonl").read_text().splitlines()]
    assert [line["payload"] for line in journal] == payloads
    assert all(line["size_fraction"] < 0.8 for line in journal if line["payload"] == "delta")
    assert all(line["size_fraction"] == 1.0 for line in journal if line["payload"] == "full")
    # the first worker keeps both payloads of a delta version, so it can relay to either kind of child
    assert first.store.is_complete(4, "delta") and first.store.is_complete(4, "full")

    # a late joiner holds no base for the delta of version 4: it fetches the full payload instead
    late, late_engine = new_worker(
        redis_client, keys, tiny_policy_dir, worker_servers, parents=lambda learner_url: [first_url]
    )
    assert late.update(late_engine) == 4
    assert_same_weights(late_engine, model)
    assert late.last_swap.num_bytes == journal[-1]["full_size_bytes"] and late.last_swap.source_url == first_url

    # a worker that missed a version (its base is 4; 6 is a delta against 5) also falls back to the full
    for version in (5, 6):
        train_a_little(model, seed=version)
        publisher.publish(publication_state(model), version)
    assert late.update(late_engine) == 6
    assert_same_weights(late_engine, model)
    assert late.store.is_complete(6, "full") and not late.store.is_complete(6, "delta")
    for sync in (first, second, late):
        sync.close()


def new_publisher(bus: StreamBus, keys: RunKeys, learner_server: ChunkServer) -> WeightPublisher:
    """Deltas from the second version on: the run files' K (10) is more than these tests publish."""
    return WeightPublisher(
        bus,
        keys,
        learner_server.store,
        public_url=learner_server.url,
        signing_key=SIGNING_KEY,
        chunk_size_bytes=16384,
        full_every=10,
    )


def test_a_partitioned_worker_without_its_base_takes_the_newest_full_payload_from_a_peer(
    bus: StreamBus,
    keys: RunKeys,
    redis_client: redis.Redis,
    learner_server: ChunkServer,
    worker_servers: list[ChunkServer],
    tiny_policy_dir: Path,
) -> None:
    model, _ = load_policy(tiny_policy_dir)
    publisher = new_publisher(bus, keys, learner_server)
    peer, peer_engine = new_worker(redis_client, keys, tiny_policy_dir, worker_servers)
    peer_url = worker_servers[-1].url
    cut_off, cut_off_engine = new_worker(
        redis_client, keys, tiny_policy_dir, worker_servers, parents=lambda learner_url: [peer_url]
    )
    for version in range(2):
        if version:
            train_a_little(model, seed=version)
        publisher.publish(publication_state(model), version)
        assert peer.update(peer_engine) == version and cut_off.update(cut_off_engine) == version

    # partitioned while versions 2-5 go out as deltas: its base stays version 1, the newest delta's is 4
    for version in range(2, 6):
        train_a_little(model, seed=version)
        published = publisher.publish(publication_state(model), version)
        assert published.manifest.payload == "delta" and published.manifest.base_version == version - 1
        assert peer.update(peer_engine) == version  # the peer rebuilds each and keeps the full payload to relay

    assert cut_off.update(cut_off_engine) == 5
    assert_same_weights(cut_off_engine, model)
    swap = cut_off.last_swap
    assert swap is not None and swap.policy_version == 5
    # every byte of the full payload came from the peer: the learner's uplink carried none of it
    assert swap.num_bytes == published.full_manifest.total_size_bytes > published.manifest.total_size_bytes
    assert swap.parent_url == peer_url and swap.parent_bytes == swap.num_bytes
    assert cut_off.store.is_complete(5, "full") and not cut_off.store.is_complete(5, "delta")
    for sync in (peer, cut_off):
        sync.close()


def test_a_worker_without_the_base_whose_peer_holds_only_the_delta_takes_the_full_payload_from_the_learner(
    bus: StreamBus,
    keys: RunKeys,
    redis_client: redis.Redis,
    learner_server: ChunkServer,
    worker_servers: list[ChunkServer],
    tiny_policy_dir: Path,
) -> None:
    # A peer that holds only the delta of the newest version (it is still rebuilding it, or could not get the
    # full manifest) answers a request for the full payload "not held" at once: the worker takes it from the
    # learner instead of waiting for the peer to hear of it (both would wait 20 s here).
    model, _ = load_policy(tiny_policy_dir)
    publisher = new_publisher(bus, keys, learner_server)
    publisher.publish(publication_state(model), 0)
    train_a_little(model, seed=1)
    published = publisher.publish(publication_state(model), 1)
    assert published.manifest.payload == "delta"
    delta_only = Holder(ChunkStore(keep_versions=4), wait_s=20.0, stall_timeout_s=21.0)
    try:
        delta_only.fetch_in_background(published.manifest, [learner_server.url])
        delta_only.done()
        assert not delta_only.store.is_complete(1, "full")
        fresh, fresh_engine = new_worker(
            redis_client,
            keys,
            tiny_policy_dir,
            worker_servers,
            parents=lambda learner_url: [delta_only.url],
            chunk_wait_s=20.0,
        )
        started_s = time.monotonic()
        assert fresh.update(fresh_engine) == 1
        assert time.monotonic() - started_s < 10.0  # the peer was not waited on
        assert_same_weights(fresh_engine, model)
        swap = fresh.last_swap
        assert swap is not None and swap.num_bytes == published.full_manifest.total_size_bytes
        assert swap.parent_url == delta_only.url and swap.parent_bytes == 0
        assert swap.source_url == learner_server.url
        fresh.close()
    finally:
        delta_only.close()


def test_a_forged_delta_is_refused_and_the_engine_keeps_its_weights(
    bus: StreamBus,
    keys: RunKeys,
    redis_client: redis.Redis,
    learner_server: ChunkServer,
    worker_servers: list[ChunkServer],
    tiny_policy_dir: Path,
) -> None:
    model, _ = load_policy(tiny_policy_dir)
    honest = WeightPublisher(
        bus,
        keys,
        learner_server.store,
        public_url=learner_server.url,
        signing_key=SIGNING_KEY,
        chunk_size_bytes=16384,
        full_every=10,
    )
    sync, engine = new_worker(redis_client, keys, tiny_policy_dir, worker_servers)
    honest.publish(publication_state(model), 0)
    assert sync.update(engine) == 0

    forger = WeightPublisher(
        bus,
        keys,
        learner_server.store,
        public_url=learner_server.url,
        signing_key=FORGER_KEY,
        chunk_size_bytes=16384,
        full_every=10,
    )
    forger._previous = honest._previous  # noqa: SLF001 (a forger that knows the base: it can build a valid-looking delta)
    train_a_little(model, seed=1)
    assert forger.publish(publication_state(model), 1).manifest.payload == "delta"

    assert sync.update(engine) is None
    assert engine.policy_version == 0 and sync.num_rejected == 1
    sync.close()
