"""Shared fixtures: a real redis-server per test session, a fresh run id (and so key prefix) per test,
the tiny policy built once. Also the tier rule: a test under tests/integration/, tests/e2e/ or tests/faults/ carries
that tier's marker (unit tests, under tests/unit/, need no real servers and carry neither)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cluster.redis_server import RedisServer
from shared.bus import StreamBus, connect
from shared.keys import RunKeys

TIERS = ("integration", "e2e", "faults")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        directory = item.path.parent.name
        for tier in TIERS:
            if (directory == tier) != (item.get_closest_marker(tier) is not None):
                raise pytest.UsageError(f"{item.nodeid}: pytest.mark.{tier} is for tests under tests/{tier}/ only")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = connect(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def keys(run_id: str, redis_client: redis.Redis) -> Iterator[RunKeys]:
    run_keys = RunKeys(run_id)
    yield run_keys
    for key in redis_client.scan_iter(match=run_keys.prefix + "*"):
        redis_client.delete(key)


@pytest.fixture
def bus(redis_client: redis.Redis, keys: RunKeys) -> StreamBus:
    return StreamBus(redis_client, keys, service="test")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny random-init Qwen2 + character tokenizer for the arithmetic task, built once."""
    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tasks import TASKS

    alphabet = TASKS["arithmetic_mod10"].alphabet
    return build_initial_policy(ModelConfig(max_position_embeddings=32), alphabet, tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="session")
def poker_policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Qwen2 with the character tokenizer of the multi-turn kuhn_poker task, built once
    (128 positions: the prompt, two turns and the observation between them)."""
    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tasks.poker import KuhnPokerTask

    config = ModelConfig(init="tiny-random", max_position_embeddings=128)
    return build_initial_policy(config, KuhnPokerTask.alphabet, tmp_path_factory.mktemp("poker-policy"))


@pytest.fixture
def model_dir(tiny_policy_dir: Path) -> Path:
    """The tiny policy, under the name the services' settings give a model folder."""
    return tiny_policy_dir
