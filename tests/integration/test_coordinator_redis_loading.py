"""The coordinator while Redis replays its AOF after a restart: every endpoint that touches Redis answers
503 with Retry-After and the reason, never a 500, and serves again once the data is loaded.

Regression: a heartbeat answered 500 (an ASGI traceback) during the replay. Its hot path reads replies
with its own hiredis parser (services/coordinator/redis_script.py), which raised the LOADING reply as a
plain ResponseError, not redis-py's BusyLoadingError (a ConnectionError, which errors.py answers 503).

The replay is made slow, and so observable, by the server's own test options: the AOF's base is an RDB
file (BGREWRITEAOF), `key-load-delay` sleeps after each key it loads, and `loading-process-events-interval-
bytes` lets Redis answer clients (LOADING) between any two keys instead of every 2 MB.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cluster.redis_server import RedisServer
from services.coordinator.redis_script import ScriptConnection
from shared.config import CoordinatorConfig, RunConfig
from shared.work_api import LEASE_PATH
from tests.coordinator_rest import ADMIN_TOKEN, bearer, register, served_coordinator
from tests.polling import wait_for

pytestmark = pytest.mark.integration

NUM_FILLER_KEYS = 2_000
FILLER_VALUE = b"x" * 2048  # past loading-process-events-interval-bytes: Redis answers between any two keys
KEY_LOAD_DELAY_US = 2_000  # x NUM_FILLER_KEYS: the replay takes about 4 s
SLOW_LOAD = ("--key-load-delay", str(KEY_LOAD_DELAY_US), "--loading-process-events-interval-bytes", "1024")


def no_retry_client(url: str) -> redis.Redis:
    """What shared.bus.connect makes, minus redis-py's own retries of a ConnectionError (BusyLoadingError is
    one), which would hold each request for seconds before the coordinator's answer."""
    return redis.Redis.from_url(url, socket_timeout=5.0, retry=Retry(NoBackoff(), 0))


def write_filler_into_the_aof_base(client: redis.Redis) -> None:
    """NUM_FILLER_KEYS keys, then an AOF rewrite: they land in the RDB base file, which key-load-delay slows."""
    for start in range(0, NUM_FILLER_KEYS, 500):
        with client.pipeline(transaction=False) as pipe:
            for i in range(start, start + 500):
                pipe.set(f"filler:{i}", FILLER_VALUE)
            pipe.execute()
    client.bgrewriteaof()

    def rewritten() -> bool:
        info = client.info("persistence")
        done = not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]
        return done and info["aof_last_bgrewrite_status"] == "ok"

    wait_for(rewritten, "the AOF rewrite", timeout_s=10)


def is_loading(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.exceptions.BusyLoadingError:
        return True
    except redis.ConnectionError:  # not listening yet
        return False
    raise AssertionError("Redis had loaded its data before it was seen loading: make the replay slower")


async def call_once(connection: ScriptConnection) -> object:
    try:
        return await connection.call([], [])
    finally:
        await connection.close()


def test_every_endpoint_answers_503_while_redis_loads_its_aof_then_serves_again(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", server_args=SLOW_LOAD).start()
    client = no_retry_client(server.url)
    probe = no_retry_client(server.url)
    run = RunConfig(run_id="loading", coordinator=CoordinatorConfig(lease_s=60.0))
    try:
        with served_coordinator(run, client) as coordinator:
            api = coordinator.client
            worker = register(api)
            beat_url = f"/v1/workers/{worker.worker_id}/heartbeat"
            requests: dict[str, Callable[[], httpx.Response]] = {
                "heartbeat (hot path)": lambda: api.post(beat_url, headers=bearer(worker.token), json={}),
                "register": lambda: api.post("/v1/workers", json={"name": "w2"}),
                "lease work": lambda: api.post(LEASE_PATH, headers=bearer(worker.token), json={"max_groups": 1}),
                "list workers": lambda: api.get("/v1/workers"),
                "status": lambda: api.get("/v1/status", headers=bearer(ADMIN_TOKEN)),
            }
            assert requests["heartbeat (hot path)"]().status_code == 200  # its Redis connection is open now
            write_filler_into_the_aof_base(client)

            server.stop()
            server.launch()  # the same data directory and port: it replays the AOF
            wait_for(lambda: is_loading(probe), "redis-server to listen and answer LOADING", timeout_s=10)

            for what, send in requests.items():

                def says_loading(what: str = what, send: Callable[[], httpx.Response] = send) -> bool:
                    answer = send()
                    assert answer.status_code == 503, f"{what}: HTTP {answer.status_code}: {answer.text[:300]}"
                    assert answer.headers["Retry-After"] == "1", what
                    return "loading" in answer.json()["detail"]

                # the first call on a connection from before the restart may find it closed: 503 unreachable
                wait_for(says_loading, f"{what}: 503 saying redis is loading", timeout_s=5)
            # the hot path's own parser raises what redis-py would: a ConnectionError every policy waits out
            with pytest.raises(redis.exceptions.BusyLoadingError):
                asyncio.run(call_once(ScriptConnection.like(client, "return 1")))
            assert is_loading(probe)  # every answer above came while Redis was still loading

            beat = wait_for(
                lambda: (answer := requests["heartbeat (hot path)"]()).status_code != 503 and answer,
                "a heartbeat answered once the AOF is loaded",
                timeout_s=15,
            )
            assert beat.status_code == 200, beat.text
            assert probe.get("filler:0") == FILLER_VALUE
            assert requests["status"]().status_code == 200
    finally:
        client.close()
        probe.close()
        server.stop()
