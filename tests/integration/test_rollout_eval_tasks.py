"""A real rollout worker (both batching modes) serving eval tasks through the real coordinator on a real
redis-server, with weights published and signed as the learner does: it names its engine's version when it
leases, takes that version's eval tasks (never another version's), decodes each greedily with exactly those
weights (the tokens a fresh engine with the same weights picks greedily), and answers them to `eval_rollouts`,
none of it counted as a rollout."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import torch
from safetensors.torch import save as safetensors_save

from engines.interface import Sampling
from engines.torch_engine import TorchEngine
from services.rollout.worker import RolloutWorker
from shared.bus import StreamBus
from shared.config import CoordinatorConfig, RolloutConfig, RunConfig, WorkConfig
from shared.keys import RunKeys
from shared.messages import LearnerState, WeightsPublished
from shared.streams import EVAL_ROLLOUTS, LEARNER_STATE, ROLLOUTS, WEIGHTS, eval_tasks
from shared.tokenization import PromptInput
from shared.weight_channel import ChunkServer, ChunkStore
from shared.weight_channel.manifest import build_manifest
from tests.coordinator_rest import ServeCoordinator, worker_settings
from tests.eval_tasks import issue_evals
from tests.polling import wait_for
from tests.weights_keys import SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

VERSION = 1


@pytest.fixture
def chunks() -> Iterator[ChunkServer]:
    server = ChunkServer(ChunkStore(), wait_s=1.0).start()
    yield server
    server.stop()


def publish(bus: StreamBus, keys: RunKeys, server: ChunkServer, model_dir: Path, version: int) -> bytes:
    """Version `version` (the tiny policy, perturbed) signed, served and announced; its blob."""
    state = {k: v for k, v in TorchEngine(model_dir).model.state_dict().items() if k != "lm_head.weight"}
    generator = torch.Generator().manual_seed(version)
    blob = safetensors_save(
        {k: (v + 0.1 * torch.randn(v.shape, generator=generator)).contiguous() for k, v in state.items()}
    )
    manifest, pieces = build_manifest(
        blob, run_id=keys.run_id, policy_version=version, chunk_size_bytes=128 * 1024, signing_key=SIGNING_KEY
    )
    server.store.put_version(manifest, pieces)
    bus.put_state(
        LEARNER_STATE,
        LearnerState(
            run_id=keys.run_id,
            status="training",
            learner_version=version,
            published_version=version,
            staleness_bound=2,
            num_steps_target=10,
        ),
    )
    bus.publish(
        WEIGHTS,
        WeightsPublished(
            run_id=keys.run_id,
            policy_version=version,
            manifest_url=f"{server.url}/v1/weights/{version}/manifest",
            manifest_sha256=manifest.sha256(),
            total_size_bytes=manifest.total_size_bytes,
            num_chunks=manifest.num_chunks,
        ),
    )
    return blob


@pytest.mark.parametrize("batching", ["batch", "continuous"])
def test_a_worker_answers_its_versions_eval_tasks_greedily_with_those_weights_and_no_others(
    batching: Literal["batch", "continuous"],
    serve_coordinator: ServeCoordinator,
    chunks: ChunkServer,
    bus: StreamBus,
    keys: RunKeys,
    model_dir: Path,
) -> None:
    run = RunConfig(
        run_id=keys.run_id,
        rollout=RolloutConfig(heartbeat_interval_s=0.2, claim_idle_ms=60_000, batching=batching),
        coordinator=CoordinatorConfig(lease_s=5.0),
        work=WorkConfig(earn_leases=False),
    )
    url = serve_coordinator(run).url
    prompts = [f"{a}+{b}=" for a in range(3) for b in range(4)]
    tasks = {task.task_id: task for task in issue_evals(bus, VERSION, prompts)}
    issue_evals(bus, VERSION + 1, prompts[:2])  # a version the worker never holds
    blob = publish(bus, keys, chunks, model_dir, VERSION)
    engine = TorchEngine(model_dir)
    worker = RolloutWorker(run, worker_settings(url, model_dir, f"eval-{batching}"), engine)
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    try:
        wait_for(lambda: bus.length(EVAL_ROLLOUTS) == len(prompts), "every eval answer")
        worker_id = worker.membership.worker_id
    finally:
        worker.stop()
        thread.join(timeout=20)
    assert not thread.is_alive()

    answers = bus.entries(EVAL_ROLLOUTS)
    reference = TorchEngine(model_dir)
    reference.load_weights(blob, VERSION)
    greedy = reference.generate([PromptInput(p) for p in prompts], Sampling(1, 2, 1.0, greedy=True))
    expected = {prompt: sample.token_ids for prompt, (sample,) in zip(prompts, greedy, strict=True)}
    assert {group.task_id for group in answers} == set(tasks)
    for group in answers:
        assert group.policy_version == VERSION and group.num_samples == 1 and not group.version_changes
        assert group.worker_id == worker_id and group.producer_mac
        (tokens,) = group.sample_tokens()
        assert tokens.tolist() == expected[tasks[group.task_id].prompt], group.prompt
    unread, pending = bus.group_progress(eval_tasks(VERSION + 1))
    assert (unread, pending) == (2, 0)  # never leased: the worker held version 1 only
    assert bus.length(ROLLOUTS) == 0 and worker.num_groups_done == 0  # not rollouts
