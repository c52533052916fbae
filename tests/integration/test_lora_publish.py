"""A LoRA run's versions against real Redis and a real chunk server: the learner publishes only the
adapter (signed, chunked, whole: no deltas), a worker on the same base fetches, verifies and applies it
and then samples the learner's policy; a worker holding another base refuses it before fetching."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load as safetensors_load

from engines.interface import InferenceEngine, Sampling
from engines.torch_engine import TorchEngine
from services.learner.lora import adapter_spec
from services.learner.publish import publication_state, serialize_weights
from services.learner.trainer import load_policy
from services.rollout.announcement_client import StreamAnnouncements
from services.rollout.weights_sync import WeightsSync
from shared.bus import StreamBus
from shared.config import LoraConfig, ModelConfig
from shared.keys import RunKeys
from shared.streams import WEIGHTS
from shared.tasks import TASKS
from shared.weight_channel import (
    PEFT_PREFIX,
    ChunkServer,
    ChunkStore,
    WeightFollower,
    WeightPublisher,
    base_fingerprint,
)
from shared.weight_channel.client import fetch_manifest, fetch_version
from tests.lora_policies import learner_logprobs, lora_policy
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0)
PROMPTS = ["3+4=", "1+2=", "9+9="]


def lora_model(folder: Path, seed: int) -> torch.nn.Module:
    return lora_policy(folder, LORA, seed, scale=0.5)  # as after some training: B moved away from 0


def assert_engine_samples(engine: InferenceEngine, model: torch.nn.Module) -> None:
    """The engine's samples carry the learner's LoRA policy's log-probs (its own recomputation)."""
    groups = engine.generate(PROMPTS, Sampling(4, 2, 1.0))
    for sample in (sample for group in groups for sample in group):
        torch.testing.assert_close(
            torch.tensor(sample.logprobs), learner_logprobs(model, sample, 1.0), atol=1e-4, rtol=0
        )


def publisher(bus: StreamBus, keys: RunKeys, server: ChunkServer, folder: Path) -> WeightPublisher:
    return WeightPublisher(
        bus,
        keys,
        server.store,
        public_url=server.url,
        signing_key=SIGNING_KEY,
        chunk_size_bytes=4096,
        full_every=10,  # deltas allowed by the run file: a LoRA publisher still sends every version whole
        lora=adapter_spec(LORA, folder),
    )


def test_a_lora_version_is_the_adapter_only_and_a_worker_on_the_same_base_samples_the_learners_policy(
    bus: StreamBus, keys: RunKeys, chunk_server: ChunkServer, tiny_policy_dir: Path
) -> None:
    learner = publisher(bus, keys, chunk_server, tiny_policy_dir)
    full_size_bytes = len(serialize_weights(load_policy(tiny_policy_dir)[0]))
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(
            ChunkStore(trusted_key=PUBLIC_KEY),
            PUBLIC_KEY,
            run_id=keys.run_id,
            base_fingerprint=base_fingerprint(tiny_policy_dir),
        ),
    )
    engine = TorchEngine(tiny_policy_dir)
    try:
        for version in (0, 1):
            model = lora_model(tiny_policy_dir, seed=version)
            published = learner.publish(publication_state(model), policy_version=version)
            manifest = published.manifest
            assert manifest.payload == "full" and manifest.lora == adapter_spec(LORA, tiny_policy_dir)
            assert manifest.total_size_bytes < full_size_bytes / 4  # rank 4 on a 64-wide model
            with httpx.Client(timeout=5.0) as client:
                blob = fetch_version(
                    client, chunk_server.url, fetch_manifest(client, chunk_server.url, version, PUBLIC_KEY)
                )
            names = set(safetensors_load(bytes(blob)))
            assert len(names) == 2 * 7 * 2  # A and B x 7 targets x 2 layers
            assert all(name.startswith(PEFT_PREFIX) and ".lora_" in name for name in names)

            assert sync.update(engine) == version
            assert_engine_samples(engine, model)
        assert [entry.manifest_url.endswith("/manifest") for entry in bus.entries(WEIGHTS)] == [True, True]  # no delta
    finally:
        sync.close()
        learner.close()


def test_a_worker_holding_another_base_refuses_the_adapter_and_keeps_its_weights(
    bus: StreamBus,
    keys: RunKeys,
    chunk_server: ChunkServer,
    tiny_policy_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from services.learner.model_init import build_initial_policy

    # the same tokenizer and architecture, other random weights: model_fingerprint agrees, the base does not
    other_base = build_initial_policy(
        ModelConfig(init="tiny-random", max_position_embeddings=32, seed=7),
        TASKS["arithmetic_mod10"].alphabet,
        tmp_path / "other",
    )
    assert base_fingerprint(other_base) != base_fingerprint(tiny_policy_dir)
    learner = publisher(bus, keys, chunk_server, tiny_policy_dir)
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(ChunkStore(), PUBLIC_KEY, run_id=keys.run_id, base_fingerprint=base_fingerprint(other_base)),
        retry_failed_after_s=0.0,
    )
    engine = TorchEngine(other_base)
    try:
        learner.publish(publication_state(lora_model(tiny_policy_dir, seed=0)), policy_version=0)
        with caplog.at_level(logging.ERROR, logger="services.rollout.weights_sync"):
            assert sync.update(engine) is None
            assert sync.update(engine) is None  # permanent: not retried
        assert engine.policy_version == -1 and sync.num_rejected == 1
        assert "different base weights" in caplog.text
    finally:
        sync.close()
        learner.close()


@pytest.mark.vllm
def test_a_vllm_worker_applies_lora_versions_in_place(
    bus: StreamBus, keys: RunKeys, chunk_server: ChunkServer, tmp_path: Path
) -> None:
    from engines.select import build_engine
    from services.learner.model_init import build_initial_policy
    from shared.config import RolloutConfig
    from tests.vllm_required import require_vllm

    require_vllm()
    # the demo's model with 32-wide heads: vLLM's CPU attention has no 16-wide kernel
    folder = build_initial_policy(
        ModelConfig(init="tiny-random", num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32),
        TASKS["arithmetic_mod10"].alphabet,
        tmp_path / "policy",
    )
    engine = build_engine(
        "vllm", folder, RolloutConfig(engine="vllm", vllm_kv_cache_bytes=64 << 20), max_lora_rank=LORA.rank
    )
    learner = publisher(bus, keys, chunk_server, folder)
    sync = WeightsSync(
        StreamAnnouncements(bus),
        WeightFollower(
            ChunkStore(trusted_key=PUBLIC_KEY),
            PUBLIC_KEY,
            run_id=keys.run_id,
            base_fingerprint=base_fingerprint(folder),
        ),
    )
    try:
        for version in (0, 1):
            model = lora_model(folder, seed=version)
            learner.publish(publication_state(model), policy_version=version)
            assert sync.update(engine) == version
            assert_engine_samples(engine, model)
    finally:
        sync.close()
        learner.close()
        getattr(engine, "close")()  # noqa: B009  # VLLMEngine.close: not part of the seam
