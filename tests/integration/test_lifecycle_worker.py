"""Drain and standby with real rollout workers: a `python -m services.rollout` process is drained over
REST (it finishes its batch, loses no task, deregisters, exits 0; another worker's token cannot drain
it), and an in-process worker on standby takes no tasks until the planner activates it. Real redis,
the real coordinator app under uvicorn, weights published by the learner's own WeightPublisher."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from cluster.redis_server import RedisServer
from engines.torch_engine import TorchEngine
from services.learner.publish import publication_state
from services.rollout.worker import RolloutWorker
from shared.bus import StreamBus
from shared.config import (
    ActivationConfig,
    CoordinatorConfig,
    GRPOConfig,
    RolloutConfig,
    RunConfig,
    ScheduleConfig,
)
from shared.keys import RunKeys
from shared.messages import LearnerState, TaskGroup
from shared.streams import LEARNER_STATE, ROLLOUTS, TASKS
from shared.weight_channel import ChunkServer, ChunkStore, WeightPublisher
from tests.coordinator_rest import ADMIN_TOKEN, JOIN_HEADERS, JOIN_TOKEN, worker_settings
from tests.polling import CallCounter, wait_for
from tests.weights_keys import PUBLIC_KEY_HEX, SIGNING_KEY

pytestmark = pytest.mark.integration
torch.set_num_threads(1)


@pytest.fixture
def run(keys: RunKeys) -> RunConfig:
    return RunConfig(
        run_id=keys.run_id,
        grpo=GRPOConfig(group_size=4, groups_per_step=8),  # R = 32 samples per step
        schedule=ScheduleConfig(staleness_bound=2),
        rollout=RolloutConfig(heartbeat_interval_s=0.2, claim_idle_ms=60_000),
        coordinator=CoordinatorConfig(lease_s=30.0),
        activation=ActivationConfig(min_dwell_s=0.0, replan_interval_s=0.2),
    )


@pytest.fixture
def publish_version_0(bus: StreamBus, keys: RunKeys, model_dir: Path) -> Iterator[None]:
    """The learner's side: version 0 announced and servable, the learner at version 0."""
    store = ChunkStore()
    server = ChunkServer(store, wait_s=1.0).start()
    publisher = WeightPublisher(
        bus, keys, store, public_url=server.url, signing_key=SIGNING_KEY, chunk_size_bytes=64 * 1024
    )
    publisher.publish(publication_state(TorchEngine(model_dir).model), 0)
    set_learner(bus, keys, train_s=1.0)
    yield
    server.stop()


def set_learner(bus: StreamBus, keys: RunKeys, *, train_s: float) -> None:
    state = LearnerState(
        run_id=keys.run_id,
        status="training",
        learner_version=0,
        published_version=0,
        staleness_bound=2,
        num_steps_target=100,
        num_steps_done=10,
        train_s_total=10 * train_s,
        wall_s=10 * train_s,
    )
    bus.put_state(LEARNER_STATE, state)


def publish_tasks(bus: StreamBus, keys: RunKeys, prefix: str, count: int, num_samples: int = 16) -> list[str]:
    task_ids = [f"{prefix}-{i}" for i in range(count)]
    for i, task_id in enumerate(task_ids):
        bus.publish(
            TASKS,
            TaskGroup(
                run_id=keys.run_id,
                task_id=task_id,
                task_name="arithmetic_mod10",
                prompt=f"{i % 10}+{(i * 7) % 10}=",
                num_samples=num_samples,
                max_new_tokens=8,
                temperature=1.0,
            ),
        )
    return task_ids


@contextlib.contextmanager
def tasks_fed(bus: StreamBus, keys: RunKeys, *, num_samples: int) -> Iterator[list[str]]:
    """Like the reward service: keep a shallow backlog of TASKS (8 groups at a time) while the block runs.
    Yields the ids published so far (the list grows); on exit no more are published."""
    task_ids: list[str] = []
    feeding = threading.Event()
    feeding.set()

    def feed() -> None:
        while feeding.is_set():
            if bus.backlog(TASKS) < 16:
                task_ids.extend(publish_tasks(bus, keys, f"t{len(task_ids)}", 8, num_samples=num_samples))
            time.sleep(0.01)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        yield task_ids
    finally:
        feeding.clear()
        feeder.join(timeout=5)


def rollout_task_ids(bus: StreamBus, keys: RunKeys) -> list[str]:
    return [group.task_id for group in bus.entries(ROLLOUTS)]


def workers_named(url: str, name: str) -> list[dict]:
    return [w for w in httpx.get(f"{url}/v1/workers").json() if w["name"] == name]


def activation(url: str) -> dict:
    """The planner's last activation plan (planned_at_s: when that pass ran)."""
    return httpx.get(f"{url}/v1/activation").json()


def test_a_drained_worker_process_finishes_its_batch_loses_no_task_and_leaves(
    run: RunConfig,
    redis_server: RedisServer,
    coordinator_url: str,
    publish_version_0: None,
    bus: StreamBus,
    keys: RunKeys,
    model_dir: Path,
    repo_root: Path,
    tmp_path: Path,
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'run_id = "{keys.run_id}"\n[rollout]\nheartbeat_interval_s = 0.2\nclaim_idle_ms = 60000\n')
    bus.ensure_group(TASKS)
    with tasks_fed(bus, keys, num_samples=64) as task_ids:
        env = {
            **os.environ,
            "RL_WEIGHTS_PUBLIC_KEY": PUBLIC_KEY_HEX,
            "RL_JOIN_TOKEN": JOIN_TOKEN,
            "RL_COORDINATOR_URL": coordinator_url,
            "RL_RUN_CONFIG": str(run_file),
            "RL_MODEL_DIR": str(model_dir),
            "RL_WORKER_NAME": "to-drain",
            "RL_WORKER_MAX_GROUPS_PER_BATCH": "4",
        }
        process = subprocess.Popen([sys.executable, "-m", "services.rollout"], cwd=repo_root, env=env)
        try:
            wait_for(lambda: len(rollout_task_ids(bus, keys)) >= 8, "the worker process publishes groups", timeout_s=60)
            [worker] = workers_named(coordinator_url, "to-drain")
            other = httpx.post(f"{coordinator_url}/v1/workers", json={"name": "other"}, headers=JOIN_HEADERS).json()

            refused = httpx.post(
                f"{coordinator_url}/v1/workers/{worker['worker_id']}/drain",
                headers={"Authorization": f"Bearer {other['token']}"},
            )
            assert refused.status_code == 403
            refused_at_beat_s = workers_named(coordinator_url, "to-drain")[0]["last_heartbeat_s"]
            wait_for(  # had the refusal drained it, this heartbeat's answer would have told the worker
                lambda: workers_named(coordinator_url, "to-drain")[0]["last_heartbeat_s"] > refused_at_beat_s,
                "a heartbeat after the refused drain",
            )
            assert process.poll() is None and workers_named(coordinator_url, "to-drain")[0]["state"] == "active"

            drained = httpx.post(
                f"{coordinator_url}/v1/workers/{worker['worker_id']}/drain",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            )
            assert drained.status_code == 200 and drained.json()["state"] == "draining"
            # tasks keep coming until it has left: a worker that ignored the drain would never run out of work
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    assert workers_named(coordinator_url, "to-drain") == []  # it deregistered
    done = rollout_task_ids(bus, keys)
    assert 0 < len(done) < len(task_ids)
    # nothing is left pending on the drained consumer: its last batch was published and acked
    pending = bus.redis.xpending(keys.name_of(TASKS), TASKS.group)
    assert pending["pending"] == 0, pending
    assert bus.backlog(TASKS) == len(task_ids) - len(set(done))
    # a second worker takes over: every task ends up sampled exactly once
    settings = worker_settings(coordinator_url, model_dir, "successor", worker_max_groups_per_batch=16)
    successor = RolloutWorker(run, settings, TorchEngine(model_dir))
    thread = threading.Thread(target=successor.run, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: len(rollout_task_ids(bus, keys)) == len(task_ids), "the successor samples the rest", timeout_s=60
        )
    finally:
        successor.stop()
        thread.join(timeout=15)
    assert sorted(rollout_task_ids(bus, keys)) == sorted(task_ids)


def test_a_standby_worker_keeps_heartbeating_and_fresh_weights_but_takes_no_tasks_until_activated(
    run: RunConfig,
    redis_server: RedisServer,
    coordinator_url: str,
    publish_version_0: None,
    bus: StreamBus,
    keys: RunKeys,
    model_dir: Path,
) -> None:
    # a free worker already covers the requirement (R / T_train = 32 samples/s, target 38.4)
    free = httpx.post(f"{coordinator_url}/v1/workers", json={"name": "free"}, headers=JOIN_HEADERS).json()
    httpx.post(
        f"{coordinator_url}/v1/workers/{free['worker_id']}/heartbeat",
        headers={"Authorization": f"Bearer {free['token']}"},
        json={"samples_per_s": 100.0},
    )
    wait_for(lambda: httpx.get(f"{coordinator_url}/v1/capacity").json()["known"], "the planner knows the requirement")
    settings = worker_settings(coordinator_url, model_dir, "priced", worker_price_per_hour=2.0)
    engine = TorchEngine(model_dir)
    worker = RolloutWorker(run, settings, engine)
    turns = CallCounter(worker, "serve_once")
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: workers_named(coordinator_url, "priced"), "registration")
        wait_for(lambda: engine.policy_version == 0, "standby keeps its weights fresh")
        bus.ensure_group(TASKS)
        publish_tasks(bus, keys, "s", 6)
        first_beat = workers_named(coordinator_url, "priced")[0]["last_heartbeat_s"]
        # with the tasks waiting: a planner pass, a heartbeat after it (its answer carries the verdict), and
        # whole turns of the worker's loop after that; a worker that were (or believed itself) active would
        # have taken them
        planned_at_s = activation(coordinator_url)["planned_at_s"]
        wait_for(lambda: activation(coordinator_url)["planned_at_s"] > planned_at_s, "a planner pass")
        beat_s = workers_named(coordinator_url, "priced")[0]["last_heartbeat_s"]
        wait_for(
            lambda: workers_named(coordinator_url, "priced")[0]["last_heartbeat_s"] > beat_s,
            "a heartbeat after that pass",
        )
        turns.wait_for_more(2, "two turns of the worker's loop after that heartbeat")
        [priced] = workers_named(coordinator_url, "priced")
        assert priced["state"] == "standby" and worker.membership.on_standby
        assert priced["last_heartbeat_s"] > first_beat  # heartbeats go on
        assert rollout_task_ids(bus, keys) == [] and bus.backlog(TASKS) == 6

        set_learner(
            bus, keys, train_s=0.1
        )  # the learner got faster: 320 samples/s needed, the free worker is not enough
        wait_for(lambda: len(rollout_task_ids(bus, keys)) == 6, "activated, it samples the tasks")
        assert workers_named(coordinator_url, "priced")[0]["state"] == "active"
    finally:
        worker.stop()
        thread.join(timeout=15)
