"""Fixtures of the integration tier, shared by its modules: a learner-side chunk server, a hand-driven
clock, and the real coordinator app under uvicorn. Session-wide fixtures (the redis-server, the tiny
policy built once) are in tests/conftest.py; waiting helpers in tests/polling.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from shared.config import RunConfig
from shared.weight_channel import ChunkServer, ChunkStore
from tests.acl_redis import AclRedis, acl_redis_server
from tests.coordinator_rest import ServeCoordinator, ServedCoordinator, served_coordinator
from tests.manual_clock import ManualClock


@pytest.fixture
def chunk_server() -> Iterator[ChunkServer]:
    """A learner-side chunk server keeping the two newest versions; a chunk not there yet is waited for 1 s."""
    server = ChunkServer(ChunkStore(keep_versions=2), wait_s=1.0).start()
    yield server
    server.stop()


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    """A redis-server of this test's own with ACLs on, as the local runner starts it (tests/acl_redis.py)."""
    with acl_redis_server(tmp_path) as server:
        yield server


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def serve_coordinator(redis_client: redis.Redis) -> Iterator[ServeCoordinator]:
    """serve_coordinator(run, lease_clock=None, control_clock=None) -> ServedCoordinator: the real
    coordinator app for `run` on this test's Redis, served until the test ends (tests/coordinator_rest.py)."""
    with contextlib.ExitStack() as stack:

        def serve(run: RunConfig, **clocks: Callable[[], float]) -> ServedCoordinator:
            return stack.enter_context(served_coordinator(run, redis_client, **clocks))

        yield serve


@pytest.fixture
def coordinator_url(run: RunConfig, serve_coordinator: ServeCoordinator) -> str:
    """The coordinator of the module's `run` fixture."""
    return serve_coordinator(run).url
