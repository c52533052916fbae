"""Publishing a version: the learner's chunk server serves it over HTTP, verified and loadable, and
the announcement on `weights` is made only once every chunk is servable."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load as safetensors_load

from services.learner.publish import load_weights_blob, publication_state, serialize_weights
from services.learner.trainer import load_policy
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.streams import WEIGHTS, Stream
from shared.weight_channel import ChunkServer, ManifestError, WeightPublisher
from shared.weight_channel.client import fetch_manifest, fetch_version
from tests.weights_keys import FORGER_KEY, PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)


class ServabilityCheckingBus:
    """The real bus, but every XADD first fetches the announced version over HTTP, as a worker that
    reacts instantly would: if the chunks were not all servable yet, the fetch would fail."""

    def __init__(self, bus: StreamBus, base_url: str) -> None:
        self.bus = bus
        self.base_url = base_url
        self.blobs_fetched_before_announcing: list[bytes] = []

    def publish(self, stream: Stream[WeightsPublished], message: WeightsPublished) -> str:
        assert isinstance(message, WeightsPublished)
        with httpx.Client(timeout=5.0) as client:
            manifest = fetch_manifest(client, self.base_url, message.policy_version, PUBLIC_KEY)
            self.blobs_fetched_before_announcing.append(fetch_version(client, self.base_url, manifest))
        return self.bus.publish(stream, message)


def test_a_published_version_is_fetched_verified_and_loads_into_a_fresh_model_identically(
    bus: StreamBus, keys: RunKeys, chunk_server: ChunkServer, tiny_policy_dir: Path
) -> None:
    model, _ = load_policy(tiny_policy_dir)
    with torch.no_grad():  # make it differ from the initial weights a fresh model starts with
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    checking_bus = ServabilityCheckingBus(bus, chunk_server.url)
    publisher = WeightPublisher(
        checking_bus,
        keys,
        chunk_server.store,
        public_url=chunk_server.url,
        signing_key=SIGNING_KEY,
        chunk_size_bytes=16384,
    )

    before_s = time.time()
    published = publisher.publish(publication_state(model), policy_version=3)

    assert published.manifest.num_chunks > 1
    # T_bcast starts before the serialising, hashing, signing and storing that precede the announcement
    assert before_s <= published.announcement.publish_started_at_s <= published.announcement.published_at_s
    assert checking_bus.blobs_fetched_before_announcing == [serialize_weights(model)]
    (announcement,) = bus.entries(WEIGHTS)
    assert announcement.policy_version == 3
    assert announcement.manifest_url == f"{chunk_server.url}/v1/weights/3/manifest"
    with httpx.Client(timeout=5.0) as client:
        manifest = fetch_manifest(client, chunk_server.url, 3, PUBLIC_KEY)
        assert manifest.sha256() == announcement.manifest_sha256
        assert client.get(announcement.manifest_url).content == manifest.to_json()
        blob = fetch_version(client, chunk_server.url, manifest)
        assert "lm_head.weight" not in safetensors_load(bytes(blob))  # tied to the embedding: sent once
        with pytest.raises(ManifestError):
            fetch_manifest(client, chunk_server.url, 3, FORGER_KEY.public_key())

    fresh, _ = load_policy(tiny_policy_dir)
    load_weights_blob(fresh, blob)
    expected, loaded = model.state_dict(), fresh.state_dict()
    assert expected.keys() == loaded.keys()
    for name in expected:
        assert torch.equal(expected[name], loaded[name]), name
    assert fresh.lm_head.weight.data_ptr() == fresh.get_input_embeddings().weight.data_ptr()  # still tied
