"""Publishing a policy version: serialise, chunk, sign, make servable, and only then announce.

    blob      = safetensors bytes of the state dict (the tied lm_head left out)
    manifest  = build_manifest(blob): version, sizes, sha256 of every chunk, HMAC under the cluster key
    store     = ChunkStore.put_version(manifest, chunks)    # the learner's ChunkServer serves it now
    announce  = XADD WeightsPublished to `weights`          # last: every chunk is servable by then

A worker loads the blob with `load_weights_blob` (or its own equivalent): safetensors, HF
state-dict names, float32; a model with tied embeddings gets lm_head back from the embedding.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from services.learner.retry import call_with_retry
from shared.bus import StreamBus
from shared.chunk_server import ChunkStore
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.weights import Manifest, build_manifest

log = logging.getLogger(__name__)

TIED_HEAD = "lm_head.weight"


def serialize_weights(model: torch.nn.Module) -> bytes:
    """safetensors bytes of the model's state dict. With tied embeddings lm_head.weight is the same
    tensor as embed_tokens.weight: sending it twice would double the bytes (and safetensors refuses
    shared tensors), so it is left out and re-tied by the receiver's model."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {
        name: tensor.detach().cpu().contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == TIED_HEAD)
    }
    return safetensors_save(tensors)


def load_weights_blob(model: torch.nn.Module, blob: bytes) -> None:
    """Load `serialize_weights` bytes into a model of the same architecture (in place)."""
    tensors = safetensors_load(blob)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if unexpected or [name for name in missing if not (tied and name == TIED_HEAD)]:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")


@dataclass(frozen=True)
class PublishedVersion:
    manifest: Manifest
    announcement: WeightsPublished
    publish_s: float  # serialise + chunk + sign + store + announce


class WeightPublisher:
    """Owns the learner's ChunkStore (served by its ChunkServer) and the `weights` announcements."""

    def __init__(
        self,
        bus: StreamBus,
        keys: RunKeys,
        store: ChunkStore,
        *,
        public_url: str,
        cluster_key: bytes,
        chunk_size_bytes: int,
    ) -> None:
        self.bus = bus
        self.keys = keys
        self.store = store
        self.public_url = public_url.rstrip("/")
        self.cluster_key = cluster_key
        self.chunk_size_bytes = chunk_size_bytes
        self.published_version = -1

    def publish(self, model: torch.nn.Module, policy_version: int) -> PublishedVersion:
        # The store keeps the first manifest of a version: publishing one twice would announce a
        # manifest it does not serve. The learner publishes each version once per process.
        assert policy_version not in self.store.versions(), f"version {policy_version} already published"
        started_s = time.perf_counter()
        blob = serialize_weights(model)
        manifest, chunks = build_manifest(
            blob, run_id=self.keys.run_id, policy_version=policy_version,
            chunk_size_bytes=self.chunk_size_bytes, cluster_key=self.cluster_key,
        )
        self.store.put_version(manifest, chunks)  # every chunk servable from here on
        announcement = WeightsPublished(
            run_id=self.keys.run_id,
            policy_version=policy_version,
            manifest_url=f"{self.public_url}/v1/weights/{policy_version}/manifest",
            manifest_sha256=manifest.sha256(),
            total_size_bytes=manifest.total_size_bytes,
            num_chunks=manifest.num_chunks,
        )
        call_with_retry(lambda: self.bus.publish(self.keys.weights, announcement), "announce weights")
        self.published_version = policy_version
        publish_s = time.perf_counter() - started_s
        log.info("published v%d: %d bytes in %d chunks (%.3fs)", policy_version, manifest.total_size_bytes, manifest.num_chunks, publish_s)
        return PublishedVersion(manifest, announcement, publish_s)
