"""`relay-rl worker --coordinator URL --token T` joins a running cluster with nothing else: a real
`python -m cluster.cli worker` process takes the run file, public key and Redis URL from the real
coordinator app (GET /v1/cluster/bootstrap), builds the run's tiny-random policy itself (the learner's
fingerprint), registers, samples the tasks with the weights the learner's own WeightPublisher published,
and Ctrl-C drains it (it deregisters and exits 0). Real redis, the coordinator under uvicorn."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from cluster.redis_server import RedisServer
from engines.torch_engine import TorchEngine
from services.learner.publish import publication_state
from shared.api import ClusterBootstrap
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.streams import TASKS
from shared.tokenization import model_fingerprint
from shared.weight_channel import ChunkServer, ChunkStore, WeightPublisher
from tests.coordinator_rest import JOIN_TOKEN, served_coordinator
from tests.integration.test_lifecycle_worker import rollout_task_ids, set_learner, tasks_fed, workers_named
from tests.polling import wait_for
from tests.weights_keys import PUBLIC_KEY_HEX, SIGNING_KEY

pytestmark = pytest.mark.integration


def run_file_text(run_id: str) -> str:
    """The run file the coordinator hands out: the tests' tiny policy (32 positions) and quick leases."""
    return f"""run_id = "{run_id}"
[model]
init = "tiny-random"
max_position_embeddings = 32
[task]
name = "arithmetic_mod10"
[rollout]
heartbeat_interval_s = 0.2
claim_idle_ms = 60000
[coordinator]
lease_s = 30.0
"""


@pytest.fixture
def run(keys: RunKeys) -> RunConfig:
    return RunConfig.model_validate(tomllib.loads(run_file_text(keys.run_id)))


@pytest.fixture
def bootstrapped_coordinator(run: RunConfig, redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[str]:
    bootstrap = ClusterBootstrap(
        run_id=run.run_id,
        run_config_toml=run_file_text(run.run_id),
        weights_public_key=PUBLIC_KEY_HEX,
        model=run.model,
    )
    with served_coordinator(run, redis_client, bootstrap=bootstrap) as served:
        yield served.url


@pytest.fixture
def publish_version_0(bus: StreamBus, keys: RunKeys, model_dir: Path) -> Iterator[None]:
    """The learner's side, as services.learner does it: version 0 of the tiny policy announced and servable,
    signed with the model folder's fingerprint."""
    store = ChunkStore()
    server = ChunkServer(store, wait_s=1.0).start()
    publisher = WeightPublisher(
        bus,
        keys,
        store,
        public_url=server.url,
        signing_key=SIGNING_KEY,
        chunk_size_bytes=64 * 1024,
        model_fingerprint=model_fingerprint(model_dir),
    )
    publisher.publish(publication_state(TorchEngine(model_dir).model), 0)
    set_learner(bus, keys, train_s=1.0)
    yield
    server.stop()


def learner_in_relay_plan(url: str) -> str:
    """The learner's chunk-server URL once the coordinator has read version 0's announcement (its control
    pass ingests them): where `relay-rl worker` reads the newest manifest to check its model folder."""
    return wait_for(
        lambda: httpx.get(url + "/v1/broadcast/plan").json()["learner_url"], "the learner in the relay plan"
    )


def clean_environment() -> dict[str, str]:
    """This process's environment without any RL_* variable: the worker must need none."""
    return {name: value for name, value in os.environ.items() if not name.startswith("RL_")}


def test_relay_rl_worker_joins_with_the_url_and_token_alone_samples_and_drains_on_ctrl_c(
    bootstrapped_coordinator: str,
    publish_version_0: None,
    bus: StreamBus,
    keys: RunKeys,
    model_dir: Path,
    repo_root: Path,
    tmp_path: Path,
) -> None:
    url = bootstrapped_coordinator
    learner_in_relay_plan(url)
    bus.ensure_group(TASKS)
    work_dir = tmp_path / "worker"
    command = [sys.executable, "-m", "cluster.cli", "worker", "--coordinator", url, "--token", JOIN_TOKEN]
    command += ["--work-dir", str(work_dir), "--name", "joined", "--public-key", PUBLIC_KEY_HEX]
    log_path = tmp_path / "worker.log"
    with tasks_fed(bus, keys, num_samples=8):
        with log_path.open("w") as log:
            process = subprocess.Popen(command, cwd=repo_root, env=clean_environment(), stdout=log, stderr=log)
        try:
            wait_for(
                lambda: any(w["num_groups_done"] > 0 for w in workers_named(url, "joined")),
                "the joined worker publishes groups",
                timeout_s=120,
                explain=lambda: log_path.read_text()[-3000:],
            )
            assert len(rollout_task_ids(bus, keys)) > 0
            # it built the run's tiny policy itself, and it is the learner's (same tokenizer and architecture)
            assert model_fingerprint(work_dir / "model") == model_fingerprint(model_dir)
            assert (work_dir / "run.toml").read_text() == run_file_text(keys.run_id)
            # rich wraps its console lines at 80 columns in a file: compare with the wraps undone
            assert "same model fingerprint as the learner's version 0" in " ".join(log_path.read_text().split())

            process.send_signal(signal.SIGINT)  # Ctrl-C: finish the batch, deregister, exit 0
            assert process.wait(timeout=60) == 0, log_path.read_text()[-3000:]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert workers_named(url, "joined") == []  # it deregistered
    assert bus.redis.xpending(keys.name_of(TASKS), TASKS.group)["pending"] == 0  # its last batch was acked


def test_a_model_folder_that_is_not_the_learners_is_refused_before_the_worker_starts(
    bootstrapped_coordinator: str,
    publish_version_0: None,
    model_dir: Path,
    repo_root: Path,
    tmp_path: Path,
) -> None:
    learner_in_relay_plan(bootstrapped_coordinator)
    other = tmp_path / "other-model"
    shutil.copytree(model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] + 8}))
    command = [sys.executable, "-m", "cluster.cli", "worker", "--coordinator", bootstrapped_coordinator]
    command += ["--token", JOIN_TOKEN, "--work-dir", str(tmp_path / "worker"), "--model-dir", str(other)]
    result = subprocess.run(
        command, cwd=repo_root, env=clean_environment(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "published for model fingerprint" in result.stderr and "Traceback" not in result.stderr
    assert workers_named(bootstrapped_coordinator, "joined") == []  # it never registered
