"""Weight sync of a rollout worker against a real ChunkServer and real Redis: an announced version is
fetched, verified, kept for relaying and loaded; a version failing any check (a corrupt chunk, a
manifest not signed by the learner's key) is never loaded nor relayed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save as safetensors_save

from engines.interface import Sampling
from engines.torch_engine import TorchEngine
from services.rollout.announcement_client import HttpAnnouncements, StreamAnnouncements
from services.rollout.weights_sync import WeightsSync
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.signing import Ed25519PrivateKey, key_id
from shared.streams import WEIGHTS
from shared.tokenization import model_fingerprint
from shared.weight_channel import (
    TIED_OUTPUT_KEY,
    ChunkServer,
    ChunkStore,
    ManifestError,
    VerifiedVersion,
    WeightFollower,
)
from shared.weight_channel.client import fetch_manifest, fetch_version
from shared.weight_channel.manifest import build_manifest
from tests.coordinator_rest import ServeCoordinator, register
from tests.corrupting_store import CorruptingStore
from tests.polling import wait_for
from tests.weights_keys import FORGER_KEY, PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

CHUNK_SIZE_BYTES = 64 * 1024
PROMPTS = ["3+4=", "12+345=", "9="]


class Learner:
    """The learner's side of a broadcast, as the learner does it: chunk, sign, serve, then announce."""

    def __init__(self, bus: StreamBus, keys: RunKeys, store: ChunkStore) -> None:
        self.bus, self.keys, self.store = bus, keys, store
        self.server = ChunkServer(store, wait_s=1.0).start()

    def publish(
        self,
        engine: TorchEngine,
        policy_version: int,
        noise_scale: float,
        signing_key: Ed25519PrivateKey = SIGNING_KEY,
        model_fingerprint: str = "",
    ) -> WeightsPublished:
        generator = torch.Generator().manual_seed(policy_version)
        blob = safetensors_save(
            {
                name: (tensor + noise_scale * torch.randn(tensor.shape, generator=generator)).contiguous()
                for name, tensor in engine.model.state_dict().items()
                if name != TIED_OUTPUT_KEY
            }
        )
        manifest, chunks = build_manifest(
            blob,
            run_id=self.keys.run_id,
            policy_version=policy_version,
            chunk_size_bytes=CHUNK_SIZE_BYTES,
            signing_key=signing_key,
            model_fingerprint=model_fingerprint,
        )
        self.store.put_version(manifest, chunks)
        announcement = WeightsPublished(
            run_id=self.keys.run_id,
            policy_version=policy_version,
            manifest_url=f"{self.server.url}/v1/weights/{policy_version}/manifest",
            manifest_sha256=manifest.sha256(),
            total_size_bytes=manifest.total_size_bytes,
            num_chunks=manifest.num_chunks,
        )
        self.bus.publish(WEIGHTS, announcement)
        return announcement


@pytest.fixture
def engine(model_dir: Path) -> TorchEngine:
    return TorchEngine(model_dir)


@pytest.fixture
def learner_store() -> CorruptingStore:
    return CorruptingStore(corrupt_index=1, corrupt=False)


@pytest.fixture
def learner(bus: StreamBus, keys: RunKeys, learner_store: CorruptingStore) -> Iterator[Learner]:
    learner = Learner(bus, keys, learner_store)
    yield learner
    learner.server.stop()


@pytest.fixture
def sync(bus: StreamBus) -> Iterator[WeightsSync]:
    # as a worker builds it: its store holds (and relays) only manifests the learner signed
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(ChunkStore(trusted_key=PUBLIC_KEY), PUBLIC_KEY, run_id=bus.keys.run_id),
        retry_failed_after_s=0.0,
    )
    yield sync
    sync.close()


def greedy_logprobs(engine: TorchEngine) -> list[list[float]]:
    return [group[0].logprobs for group in engine.generate(PROMPTS, Sampling(1, 3, 1.0, greedy=True))]


def test_an_announced_version_is_verified_kept_for_relaying_and_loaded(
    engine: TorchEngine, learner: Learner, sync: WeightsSync
) -> None:
    assert sync.update(engine) is None  # nothing announced yet
    initial = greedy_logprobs(engine)
    learner.publish(engine, policy_version=0, noise_scale=0.3)

    assert sync.update(engine) == 0
    assert engine.policy_version == 0
    swap = sync.last_swap
    assert swap is not None and swap.pause_s is not None and swap.ready_at_s is not None
    assert 0.0 < swap.pause_s <= swap.swapped_at_s - swap.ready_at_s + 1e-3  # the load lies between the two
    assert greedy_logprobs(engine) != initial
    assert sync.update(engine) is None  # already loaded

    # the worker's own store now holds every verified chunk: its chunk server can serve children
    assert sync.store.is_complete(0)
    relay = ChunkServer(sync.store).start()
    try:
        with httpx.Client() as client:
            manifest = fetch_manifest(client, relay.url, 0, PUBLIC_KEY)
            assert fetch_version(client, relay.url, manifest) == fetch_version(client, learner.server.url, manifest)
    finally:
        relay.stop()


def test_a_corrupt_chunk_is_never_loaded_and_the_version_is_retried_later(
    engine: TorchEngine, learner: Learner, learner_store: CorruptingStore, sync: WeightsSync
) -> None:
    learner.publish(engine, policy_version=0, noise_scale=0.3)
    assert sync.update(engine) == 0
    before = greedy_logprobs(engine)

    learner_store.corrupt = True
    announcement = learner.publish(engine, policy_version=1, noise_scale=0.3)
    assert announcement.num_chunks > 1

    assert sync.update(engine) is None
    assert engine.policy_version == 0 and sync.num_rejected == 1
    assert greedy_logprobs(engine) == before
    assert not sync.store.is_complete(1)

    learner_store.corrupt = False  # the holder is healthy again: the next try succeeds
    assert sync.update(engine) == 1
    assert engine.policy_version == 1


def test_a_manifest_signed_with_another_key_is_never_loaded(
    engine: TorchEngine, learner: Learner, sync: WeightsSync
) -> None:
    learner.publish(engine, policy_version=0, noise_scale=0.3, signing_key=FORGER_KEY)

    assert sync.update(engine) is None
    assert engine.policy_version == -1 and sync.num_rejected == 1
    assert sync.store.versions() == []


def test_a_forged_version_served_by_a_relay_peer_is_refused_and_never_loaded_nor_relayed(
    engine: TorchEngine, learner: Learner, sync: WeightsSync, bus: StreamBus, keys: RunKeys
) -> None:
    learner.publish(engine, policy_version=0, noise_scale=0.3)
    assert sync.update(engine) == 0
    before = greedy_logprobs(engine)
    # A malicious worker: its own chunk server holds a "version 1" it signed with the only kind of key a
    # worker can have (not the learner's), every chunk hash correct; it announces it as the learner would.
    peer = Learner(bus, keys, ChunkStore())
    relay = ChunkServer(sync.store).start()  # the honest worker's own chunk server, serving its children
    try:
        forged = peer.publish(engine, policy_version=1, noise_scale=1.0, signing_key=FORGER_KEY)
        with httpx.Client() as client:
            with pytest.raises(
                ManifestError,
                match=f"signed by key {key_id(FORGER_KEY.public_key())}, this receiver trusts key {key_id(PUBLIC_KEY)}",
            ):
                fetch_manifest(client, peer.server.url, 1, PUBLIC_KEY)

            assert sync.update(engine) is None
            assert engine.policy_version == 0 and sync.num_rejected == 1
            assert greedy_logprobs(engine) == before
            # nothing of it reached the worker's store: its children cannot be served the forged version
            assert sync.store.versions() == [0]
            assert client.get(f"{relay.url}/v1/weights/1/manifest").status_code == 404
            assert client.get(f"{relay.url}/v1/weights/latest").json()["policy_version"] == 0

            # the same manifest claiming the learner's key id: the signature itself fails
            spoofed = peer.store.manifest(1)
            assert spoofed is not None and spoofed.sha256() == forged.manifest_sha256
            spoofed = spoofed.model_copy(update={"signing_key_id": key_id(PUBLIC_KEY)})
            with pytest.raises(ManifestError, match="forged or corrupt"):
                sync.store.add_manifest(spoofed)
            assert sync.store.versions() == [0]
    finally:
        relay.stop()
        peer.server.stop()

    learner.publish(engine, policy_version=1, noise_scale=0.2)  # the learner's own version 1 loads as ever
    assert sync.update(engine) == 1


def test_a_relay_parent_holding_a_forged_version_under_the_announced_number_is_routed_around(
    engine: TorchEngine, learner: Learner, learner_store: CorruptingStore, bus: StreamBus, keys: RunKeys
) -> None:
    # the coordinator made a malicious worker our parent; it holds its own signed "version 0"
    parent = Learner(bus, keys, ChunkStore())
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(
            ChunkStore(trusted_key=PUBLIC_KEY), PUBLIC_KEY, run_id=keys.run_id, parents=lambda _: [parent.server.url]
        ),
        retry_failed_after_s=0.0,
    )
    try:
        forged = parent.publish(engine, policy_version=0, noise_scale=1.0, signing_key=FORGER_KEY)
        genuine = learner.publish(engine, policy_version=0, noise_scale=0.3)  # the newest announcement

        assert sync.update(engine) == 0
        held = sync.store.manifest(0)
        assert held is not None and held.sha256() == genuine.manifest_sha256 != forged.manifest_sha256
        assert sync.store.chunks(held) == learner_store.chunks(held)  # every byte is the learner's
        assert sync.last_swap is not None and sync.last_swap.source_url == learner.server.url
    finally:
        sync.close()
        parent.server.stop()


def test_an_announcement_naming_a_different_manifest_is_never_loaded(
    engine: TorchEngine, learner: Learner, sync: WeightsSync, bus: StreamBus, keys: RunKeys
) -> None:
    genuine = learner.publish(engine, policy_version=0, noise_scale=0.3)
    bus.publish(WEIGHTS, genuine.model_copy(update={"manifest_sha256": "0" * 64}))

    assert sync.update(engine) is None
    assert engine.policy_version == -1


def test_a_resumed_learner_announcing_an_older_version_is_followed(
    engine: TorchEngine, learner: Learner, bus: StreamBus
) -> None:
    # a store keeping one version evicts the older one on arrival: it is loaded all the same
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(ChunkStore(keep_versions=1), PUBLIC_KEY, run_id=bus.keys.run_id),
        retry_failed_after_s=0.0,
    )
    learner.publish(engine, policy_version=5, noise_scale=0.3)
    assert sync.update(engine) == 5

    learner.publish(engine, policy_version=3, noise_scale=0.2)  # restarted from an older checkpoint

    assert sync.update(engine) == 3
    assert engine.policy_version == 3
    sync.close()


def test_weights_published_for_another_model_folder_are_refused_once_and_never_loaded(
    engine: TorchEngine, learner: Learner, bus: StreamBus, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.hf_folders import build_folder

    other_folder = build_folder(tmp_path / "other")  # another tokenizer and architecture
    assert model_fingerprint(other_folder) != engine.model_fingerprint
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(ChunkStore(), PUBLIC_KEY, run_id=bus.keys.run_id, model_fingerprint=engine.model_fingerprint),
        retry_failed_after_s=0.0,
    )
    try:
        learner.publish(engine, policy_version=0, noise_scale=0.3, model_fingerprint=model_fingerprint(other_folder))
        with caplog.at_level(logging.ERROR, logger="services.rollout.weights_sync"):
            assert sync.update(engine) is None
            assert sync.update(engine) is None  # not retried: the same manifest never fits
        assert engine.policy_version == -1 and sync.num_rejected == 1
        assert "different tokenizers or architectures" in caplog.text

        learner.publish(engine, policy_version=1, noise_scale=0.3, model_fingerprint=engine.model_fingerprint)
        assert sync.update(engine) == 1  # weights for this folder load as ever
    finally:
        sync.close()


def test_a_worker_following_the_coordinators_long_poll_loads_each_version_and_closes_without_waiting_for_it(
    engine: TorchEngine, learner: Learner, keys: RunKeys, serve_coordinator: ServeCoordinator
) -> None:
    # as a worker runs it: no Redis credentials, the announcements from the coordinator (GET /v1/weights/latest)
    coordinator = serve_coordinator(RunConfig(run_id=keys.run_id))
    token = register(coordinator.client).token
    ready: list[VerifiedVersion] = []
    sync = WeightsSync(
        HttpAnnouncements(coordinator.url, lambda: token),
        WeightFollower(ChunkStore(trusted_key=PUBLIC_KEY), PUBLIC_KEY, run_id=keys.run_id),
        retry_failed_after_s=0.0,
        on_ready=ready.append,
    )

    def ready_with(version: int) -> Callable[[], bool]:
        return lambda: bool(ready) and ready[-1].policy_version == version

    sync.start()
    try:
        assert sync.newest_announced_version() is None
        for version in (5, 6, 3):  # 3: the learner resumed from an older checkpoint
            learner.publish(engine, policy_version=version, noise_scale=0.3)
            wait_for(ready_with(version), f"version {version} ready", timeout_s=20)
            assert sync.newest_announced_version() == version
            assert sync.update(engine) == version
    finally:
        closing_s = time.perf_counter()
        sync.close()
    assert time.perf_counter() - closing_s < 1.0  # the thread was in its 5 s long poll: not waited for
