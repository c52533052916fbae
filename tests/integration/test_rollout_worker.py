"""The rollout worker end to end against real parts: redis-server, the real coordinator app under
uvicorn, a learner-side ChunkServer announcing signed versions, and the tiny local model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import pytest
import torch
from safetensors.torch import save as safetensors_save

from cluster.ports import free_port
from cluster.redis_server import RedisServer
from engines.torch_engine import TorchEngine
from services.rollout.coordinator_client import CoordinatorClient, CoordinatorUnavailableError
from services.rollout.membership import Membership
from services.rollout.worker import RolloutWorker
from shared.api import HeartbeatRequest, RegisterWorkerRequest, WorkerInfo
from shared.bus import StreamBus
from shared.config import CoordinatorConfig, RolloutConfig, RunConfig, ScheduleConfig, TaskConfig, WorkConfig
from shared.keys import RunKeys
from shared.messages import EnvironmentSpec, LearnerState, RolloutGroup, TaskGroup, WeightsPublished
from shared.streams import DEAD, LEARNER_STATE, ROLLOUTS, TASKS, WEIGHTS
from shared.tasks.poker import KuhnPokerEnvironment, KuhnPokerTask
from shared.weight_channel import ChunkServer, ChunkStore
from shared.weight_channel.manifest import build_manifest
from tests.coordinator_rest import JOIN_TOKEN, ServeCoordinator, worker_settings
from tests.manual_clock import ManualClock
from tests.polling import CallCounter, wait_for
from tests.weights_keys import PUBLIC_KEY_HEX, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

STALENESS_BOUND = 1


class LearnerSide:
    """Publishes versions as the learner does (chunk, sign, serve, announce) and sets its LearnerState."""

    def __init__(self, bus: StreamBus, keys: RunKeys, model_dir: Path) -> None:
        self.bus, self.keys = bus, keys
        self.server = ChunkServer(ChunkStore(), wait_s=1.0).start()
        self.state_dict = {k: v for k, v in TorchEngine(model_dir).model.state_dict().items() if k != "lm_head.weight"}

    def publish(self, policy_version: int) -> None:
        generator = torch.Generator().manual_seed(policy_version)
        blob = safetensors_save(
            {k: (v + 0.1 * torch.randn(v.shape, generator=generator)).contiguous() for k, v in self.state_dict.items()}
        )
        manifest, chunks = build_manifest(
            blob,
            run_id=self.keys.run_id,
            policy_version=policy_version,
            chunk_size_bytes=128 * 1024,
            signing_key=SIGNING_KEY,
        )
        self.server.store.put_version(manifest, chunks)
        self.bus.publish(
            WEIGHTS,
            WeightsPublished(
                run_id=self.keys.run_id,
                policy_version=policy_version,
                manifest_url=f"{self.server.url}/v1/weights/{policy_version}/manifest",
                manifest_sha256=manifest.sha256(),
                total_size_bytes=manifest.total_size_bytes,
                num_chunks=manifest.num_chunks,
            ),
        )

    def set_version(self, learner_version: int) -> None:
        state = LearnerState(
            run_id=self.keys.run_id,
            status="training",
            learner_version=learner_version,
            published_version=learner_version,
            staleness_bound=STALENESS_BOUND,
            num_steps_target=100,
        )
        self.bus.put_state(LEARNER_STATE, state)


@pytest.fixture
def run(keys: RunKeys) -> RunConfig:
    return RunConfig(
        run_id=keys.run_id,
        schedule=ScheduleConfig(staleness_bound=STALENESS_BOUND),
        rollout=RolloutConfig(heartbeat_interval_s=0.2, claim_idle_ms=60_000),
        coordinator=CoordinatorConfig(lease_s=5.0),
        work=WorkConfig(earn_leases=False),  # no reward service scores here: a worker holds its batch from its start
    )


@pytest.fixture
def learner(bus: StreamBus, keys: RunKeys, model_dir: Path) -> Iterator[LearnerSide]:
    learner = LearnerSide(bus, keys, model_dir)
    yield learner
    learner.server.stop()


def make_task(run_id: str, task_id: str, prompt: str, num_samples: int = 4) -> TaskGroup:
    return TaskGroup(
        run_id=run_id,
        task_id=task_id,
        task_name="arithmetic_mod10",
        prompt=prompt,
        num_samples=num_samples,
        max_new_tokens=2,
        temperature=1.0,
    )


def rollouts_of(bus: StreamBus, keys: RunKeys) -> dict[str, RolloutGroup]:
    return {group.task_id: group for group in bus.entries(ROLLOUTS)}


def worker_info(coordinator_url: str, worker_id: str) -> WorkerInfo | None:
    response = httpx.get(f"{coordinator_url}/v1/workers/{worker_id}")
    return WorkerInfo.model_validate_json(response.content) if response.status_code == 200 else None


def test_worker_samples_with_announced_versions_gates_on_staleness_and_dead_letters_poison(
    run: RunConfig,
    redis_server: RedisServer,
    coordinator_url: str,
    learner: LearnerSide,
    bus: StreamBus,
    keys: RunKeys,
    model_dir: Path,
) -> None:
    settings = worker_settings(coordinator_url, model_dir, "in-process", worker_max_groups_per_batch=4)
    engine = TorchEngine(model_dir)
    worker = RolloutWorker(run, settings, engine)
    turns = CallCounter(worker, "serve_once")  # a turn that takes a task returns after submitting its group
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    try:
        # no announced weights yet: registered, but nothing is taken
        bus.publish(TASKS, make_task(keys.run_id, "early", "3+4="))
        wait_for(lambda: worker.membership.num_registrations == 1, "registration")
        worker_id = worker.membership.worker_id
        turns.wait_for_more(2, "two turns of the worker's loop with a task waiting")
        assert bus.length(ROLLOUTS) == 0 and engine.policy_version == -1

        learner.set_version(0)
        learner.publish(0)
        for i in range(5):
            bus.publish(TASKS, make_task(keys.run_id, f"v0-{i}", f"{i}+{i + 1}="))
        bus.publish(TASKS, make_task(keys.run_id, "poison", "é+1="))
        wait_for(lambda: len(rollouts_of(bus, keys)) == 6, "six groups with version 0")
        wait_for(lambda: bus.length(DEAD) == 1, "the poison task dead-lettered")

        groups = rollouts_of(bus, keys)
        assert set(groups) == {"early", *(f"v0-{i}" for i in range(5))}
        for group in groups.values():
            assert group.policy_version == 0 and group.worker_id == worker_id and group.num_samples == 4
            assert len(group.prompt_tokens()) == len(group.prompt)
        assert bus.backlog(TASKS) == 0  # every task acked, the poison one via the dead letter
        [letter] = bus.dead_letters()
        assert "UnencodablePromptError" in letter.error and TaskGroup.decode(letter.payload).task_id == "poison"

        learner.set_version(1)
        learner.publish(1)
        wait_for(lambda: engine.policy_version == 1, "version 1 loaded")
        bus.publish(TASKS, make_task(keys.run_id, "v1", "5+5="))
        wait_for(lambda: "v1" in rollouts_of(bus, keys), "a group with version 1")
        assert rollouts_of(bus, keys)["v1"].policy_version == 1

        # the learner moves past what version 1 can still be admitted to: the worker stops taking work
        learner.set_version(1 + STALENESS_BOUND + 1)
        wait_for(lambda: worker.gate_state == "closed", "the staleness gate closes")
        bus.publish(TASKS, make_task(keys.run_id, "gated", "7+1="))
        turns.wait_for_more(2, "two turns of the worker's loop with the gated task waiting")
        assert "gated" not in rollouts_of(bus, keys)
        assert bus.backlog(TASKS) == 1
        learner.publish(3)
        wait_for(lambda: "gated" in rollouts_of(bus, keys), "the gated task, sampled with version 3")
        assert rollouts_of(bus, keys)["gated"].policy_version == 3

        info = worker_info(coordinator_url, worker_id)
        assert info is not None and info.endpoint_url == worker.chunk_server.url
        # groups are counted as the work API accepts them; the version arrives with the next heartbeat
        wait_for(lambda: worker_info(coordinator_url, worker_id).num_groups_done == 8, "the accepted groups counted")
        wait_for(lambda: worker_info(coordinator_url, worker_id).policy_version == 3, "a heartbeat with the version")
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert worker_info(coordinator_url, worker_id) is None  # deregistered on the way out


def test_a_continuous_worker_keeps_its_batch_full_and_new_weights_land_in_samples_in_flight(
    redis_server: RedisServer,
    serve_coordinator: ServeCoordinator,
    learner: LearnerSide,
    bus: StreamBus,
    keys: RunKeys,
    model_dir: Path,
) -> None:
    """[rollout] batching = "continuous": groups come back as their samples finish, and version 1, published
    while samples of version 0 are decoding, lands between two steps: those groups keep policy_version 0 (their
    oldest token) and name the token where version 1 took over."""
    max_rows, num_tasks = 8, 40
    run = RunConfig(
        run_id=keys.run_id,
        schedule=ScheduleConfig(staleness_bound=STALENESS_BOUND),
        rollout=RolloutConfig(
            heartbeat_interval_s=0.2, claim_idle_ms=60_000, batching="continuous", continuous_max_rows=max_rows
        ),
        coordinator=CoordinatorConfig(lease_s=5.0),
        work=WorkConfig(earn_leases=False),  # no reward service scores here: it may fill its batch from its start
    )
    coordinator_url = serve_coordinator(run).url
    engine = TorchEngine(model_dir)
    worker = RolloutWorker(run, worker_settings(coordinator_url, model_dir, "continuous"), engine)
    assert worker.continuous is not None
    occupancy: list[int] = []
    step = worker.continuous.tasks.batch.step

    def recorded_step() -> list:  # type: ignore[type-arg]
        finished = step()
        occupancy.append(worker.continuous.tasks.batch.last_step.num_rows)  # type: ignore[union-attr]
        return finished

    worker.continuous.tasks.batch.step = recorded_step  # type: ignore[method-assign]
    learner.set_version(0)
    learner.publish(0)
    for i in range(num_tasks):
        task = make_task(keys.run_id, f"t{i}", f"{i % 10}+{i % 7}=").model_copy(update={"max_new_tokens": 20})
        bus.publish(TASKS, task)
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(rollouts_of(bus, keys)) >= 2, "the first groups of version 0")
        learner.set_version(1)
        learner.publish(1)
        wait_for(lambda: len(rollouts_of(bus, keys)) == num_tasks, "every task's group", timeout_s=120)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()

    groups = list(rollouts_of(bus, keys).values())
    mixed = [group for group in groups if group.version_changes]
    assert mixed, "version 1 landed in samples in flight"
    for group in mixed:
        assert (group.policy_version, group.newest_version) == (0, 1)
        versions = group.token_versions()
        assert set(versions.tolist()) == {0, 1}
    assert {group.policy_version for group in groups} == {0, 1}
    assert engine.policy_version == 1
    busy = [rows for rows in occupancy if rows]
    assert max(busy) == max_rows
    assert sum(1 for rows in busy if rows == max_rows) > len(busy) / 2  # the batch stayed full most steps


@pytest.mark.parametrize("batching", ["batch", "continuous"])
def test_worker_plays_multi_turn_poker_episodes_and_publishes_masked_groups(
    redis_server: RedisServer,
    serve_coordinator: ServeCoordinator,
    bus: StreamBus,
    keys: RunKeys,
    poker_policy_dir: Path,
    batching: Literal["batch", "continuous"],
) -> None:
    """Both modes: batch mode plays the episodes of a batch in lockstep, continuous mode each turn as a row."""
    run = RunConfig(
        run_id=keys.run_id,
        task=TaskConfig(name="kuhn_poker"),
        schedule=ScheduleConfig(staleness_bound=STALENESS_BOUND),
        rollout=RolloutConfig(heartbeat_interval_s=0.2, claim_idle_ms=60_000, batching=batching),
    )
    coordinator_url = serve_coordinator(run).url
    learner = LearnerSide(bus, keys, poker_policy_dir)
    settings = worker_settings(coordinator_url, poker_policy_dir, "poker", worker_max_groups_per_batch=4)
    worker = RolloutWorker(run, settings, TorchEngine(poker_policy_dir))
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    try:
        learner.set_version(0)
        learner.publish(0)
        for seed in ("0", "4", "5"):  # first to act with Q and J (a check meets a bet or a check), second with K
            bus.publish(TASKS, poker_task(keys.run_id, seed))
        wait_for(lambda: len(rollouts_of(bus, keys)) == 3, "three poker groups")
    finally:
        worker.stop()
        thread.join(timeout=10)
        learner.server.stop()
    assert not thread.is_alive()
    for group in rollouts_of(bus, keys).values():
        assert group.is_masked and group.num_samples == 4 and group.policy_version == 0
        for tokens, mask, text, reward in zip(
            group.sample_tokens(), group.sample_masks(), group.completion_texts, group.env_rewards, strict=True
        ):
            assert mask[0] and mask[-1] and len(tokens) <= 2 * 6 + len("opp=bets;pot=3;fold/call?")
            if not mask.all():  # two turns: the opponent's answer sits between them, untrained
                assert "opp=bets;pot=3;fold/call?" in text
            assert 0.0 <= reward <= 1.0
        assert bus.backlog(TASKS) == 0
    assert {group.env_rewards[0] for group in rollouts_of(bus, keys).values()} <= {0.0, 0.25, 0.75, 1.0}
    # the engine's batch occupancy counts the episodes' decoding too, in both modes: some, never over full
    metrics = {family.name: family.samples[0].value for family in worker.occupancy.families("w")}
    assert 0 < metrics["relayrl_worker_batch_occupancy"] <= 1


def poker_task(run_id: str, seed: str) -> TaskGroup:
    return TaskGroup(
        run_id=run_id,
        task_id=f"poker-{seed}",
        task_name="kuhn_poker",
        prompt=KuhnPokerEnvironment(int(seed)).reset(),
        num_samples=4,
        max_new_tokens=6,
        temperature=1.0,
        environment=EnvironmentSpec(state=seed, max_turns=KuhnPokerTask.max_turns),
    )


def test_a_worker_declared_dead_rejoins_under_its_own_id(
    serve_coordinator: ServeCoordinator, keys: RunKeys, clock: ManualClock
) -> None:
    run = RunConfig(
        run_id=keys.run_id, rollout=RolloutConfig(heartbeat_interval_s=0.1), coordinator=CoordinatorConfig(lease_s=5.0)
    )
    url = serve_coordinator(run, lease_clock=clock).url
    membership = Membership(
        CoordinatorClient(url, join_token=JOIN_TOKEN),
        RegisterWorkerRequest(name="flaky"),
        HeartbeatRequest,
        threading.Event(),
    )
    first_id = membership.register().worker_id
    clock.advance(6.0)  # the lease runs out before the first heartbeat, which finds the worker dead (410)
    membership.start_heartbeats()
    wait_for(lambda: membership.num_registrations >= 2, "re-registration after 410")
    assert membership.worker_id == first_id  # revived: same id (issue 10: one worker per process)
    assert membership.registration.rejoined
    assert [w["worker_id"] for w in httpx.get(f"{url}/v1/workers").json()] == [first_id]
    membership.raise_if_failed()
    membership.leave()


def test_an_unreachable_coordinator_is_reported_as_unavailable() -> None:
    client = CoordinatorClient(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    with pytest.raises(CoordinatorUnavailableError):
        client.staleness(0)


def test_the_worker_process_exits_cleanly_on_sigterm(
    run: RunConfig,
    redis_server: RedisServer,
    coordinator_url: str,
    learner: LearnerSide,
    keys: RunKeys,
    model_dir: Path,
    repo_root: Path,
    tmp_path: Path,
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'run_id = "{keys.run_id}"\n[rollout]\nheartbeat_interval_s = 0.2\n')
    learner.set_version(0)
    learner.publish(0)
    run_worker_process_to_version_0(coordinator_url, run_file, model_dir, repo_root, "subprocess")
    assert httpx.get(f"{coordinator_url}/v1/workers").json() == []  # it deregistered


def run_worker_process_to_version_0(
    coordinator_url: str,
    run_file: Path,
    model_dir: Path,
    repo_root: Path,
    worker_name: str,
    *,
    startup_timeout_s: float = 30.0,
) -> None:
    """`python -m services.rollout` with `run_file`: waits until the coordinator lists it with version 0
    loaded, sends SIGTERM and asserts it exits 0; killed by PID if anything fails on the way."""
    env = {
        **os.environ,
        "RL_WEIGHTS_PUBLIC_KEY": PUBLIC_KEY_HEX,
        "RL_JOIN_TOKEN": JOIN_TOKEN,
        "RL_COORDINATOR_URL": coordinator_url,
        "RL_RUN_CONFIG": str(run_file),
        "RL_MODEL_DIR": str(model_dir),
        "RL_WORKER_NAME": worker_name,
    }
    process = subprocess.Popen([sys.executable, "-m", "services.rollout"], cwd=repo_root, env=env)
    try:

        def loaded_version_0() -> bool:
            workers = [w for w in httpx.get(f"{coordinator_url}/v1/workers").json() if w["name"] == worker_name]
            return bool(workers) and workers[0]["policy_version"] == 0

        wait_for(
            loaded_version_0,
            f"the worker process {worker_name} reports version 0",
            timeout_s=startup_timeout_s,
            interval_s=0.25,
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
