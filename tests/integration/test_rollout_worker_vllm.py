"""A rollout worker on the vLLM engine against real parts (redis-server, the coordinator app, a
learner-side chunk server announcing signed versions): each announced version is fetched, verified,
swapped in place, and the groups sampled after it carry its number and log-probs of its weights."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as safetensors_load

from cluster.redis_server import RedisServer
from services.rollout.worker import RolloutWorker
from shared.bus import StreamBus
from shared.config import CoordinatorConfig, RolloutConfig, RunConfig, ScheduleConfig
from shared.keys import RunKeys
from shared.streams import TASKS
from tests.coordinator_rest import worker_settings
from tests.hf_folders import build_char_folder
from tests.integration.test_rollout_worker import (
    STALENESS_BOUND,
    LearnerSide,
    make_task,
    rollouts_of,
    run_worker_process_to_version_0,
)
from tests.polling import wait_for
from tests.vllm_required import require_vllm

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture(scope="module", autouse=True)
def vllm_available() -> None:
    require_vllm()  # before any server or model is built


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_folder(tmp_path_factory.mktemp("char-policy"))


@pytest.fixture
def run(keys: RunKeys) -> RunConfig:
    return RunConfig(
        run_id=keys.run_id,
        schedule=ScheduleConfig(staleness_bound=STALENESS_BOUND),
        rollout=RolloutConfig(
            engine="vllm", vllm_kv_cache_bytes=64 << 20, heartbeat_interval_s=0.2, claim_idle_ms=60_000
        ),
        coordinator=CoordinatorConfig(lease_s=5.0),
    )


@pytest.fixture
def learner(bus: StreamBus, keys: RunKeys, model_dir: Path) -> Iterator[LearnerSide]:
    learner = LearnerSide(bus, keys, model_dir)
    yield learner
    learner.server.stop()


def test_a_vllm_worker_samples_with_each_announced_version(
    run: RunConfig,
    redis_server: RedisServer,
    coordinator_url: str,
    learner: LearnerSide,
    bus: StreamBus,
    keys: RunKeys,
    model_dir: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    settings = worker_settings(coordinator_url, model_dir, "vllm-in-process", worker_max_groups_per_batch=4)
    from services.rollout.worker import build_engine

    engine = build_engine(settings, run)  # through engines.select, as `python -m services.rollout` does
    assert type(engine).__name__ == "VLLMEngine"
    worker = RolloutWorker(run, settings, engine)
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    try:
        learner.set_version(0)
        learner.publish(0)
        for i in range(3):
            bus.publish(TASKS, make_task(keys.run_id, f"v0-{i}", f"{i}+{i + 1}="))
        wait_for(lambda: len(rollouts_of(bus, keys)) == 3, "three groups with version 0", timeout_s=60)
        assert all(group.policy_version == 0 and group.num_samples == 4 for group in rollouts_of(bus, keys).values())

        learner.set_version(1)
        learner.publish(1)
        wait_for(lambda: engine.policy_version == 1, "version 1 loaded", timeout_s=60)
        bus.publish(TASKS, make_task(keys.run_id, "v1", "5+5="))
        wait_for(lambda: "v1" in rollouts_of(bus, keys), "a group with version 1", timeout_s=60)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()

    group = rollouts_of(bus, keys)["v1"]
    assert group.policy_version == 1
    # the behaviour log-probs are those of version 1's weights (what the learner recomputes)
    store = learner.server.store
    manifest = store.manifest(1)
    assert manifest is not None
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reference.load_state_dict(safetensors_load(b"".join(store.chunks(manifest))), strict=False)
    prompt_ids = group.prompt_tokens().tolist()
    for tokens, logprobs in zip(group.sample_tokens(), group.sample_logprobs(), strict=True):
        ids = torch.tensor([prompt_ids + tokens.tolist()])
        with torch.no_grad():
            expected = torch.log_softmax(reference(input_ids=ids).logits[0], dim=-1)  # temperature 1.0
        positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(tokens))
        torch.testing.assert_close(
            torch.from_numpy(logprobs), expected[positions, torch.from_numpy(tokens).long()], atol=1e-4, rtol=0
        )


def test_the_worker_process_runs_the_vllm_engine_named_in_the_run_file(
    redis_server: RedisServer,
    coordinator_url: str,
    learner: LearnerSide,
    keys: RunKeys,
    model_dir: Path,
    repo_root: Path,
    tmp_path: Path,
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'run_id = "{keys.run_id}"\n[rollout]\nengine = "vllm"\nvllm_kv_cache_bytes = {64 << 20}\nheartbeat_interval_s = 0.2\n'
    )
    learner.set_version(0)
    learner.publish(0)
    run_worker_process_to_version_0(
        coordinator_url, run_file, model_dir, repo_root, "vllm-subprocess", startup_timeout_s=90
    )
