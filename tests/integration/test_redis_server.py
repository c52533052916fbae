"""RedisServer.start() returns only once the server answers with its data loaded.

A restart on the same data directory replays the append-only file first; until that is done Redis
answers LOADING to every command. A service (or the supervisor) that takes `start()` returning as
"Redis is back" must find its streams there at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from cluster.redis_acl import OPERATOR
from cluster.redis_server import RedisServer
from shared.streams import SCORED
from tests.acl_redis import acl_redis_server

pytestmark = pytest.mark.integration

NUM_ENTRIES = 200_000
VALUE = b"x" * 64


FILL_SCRIPT = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do
    redis.call('XADD', 'stream', '*', 'data', ARGV[3])
    redis.call('SET', 'key:' .. i, ARGV[3])
end
"""


def fill(client: redis.Redis) -> None:
    """~NUM_ENTRIES stream entries and as many keys, written as commands to the AOF's incremental file
    (no rewrite: the restart replays them one by one, which takes measurable time). A script writes them:
    the AOF gets each command it ran, and the test does not wait on 400,000 commands built in Python."""
    for start in range(0, NUM_ENTRIES, 50_000):
        client.eval(FILL_SCRIPT, 0, start, start + 50_000, VALUE)


def aof_size_bytes(data_dir: Path) -> int:
    return sum(path.stat().st_size for path in data_dir.rglob("*.aof"))


def test_data_written_before_a_restart_is_readable_the_moment_start_returns(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(server.url)
        fill(client)
        client.close()
        assert server.stop() == 0  # SIGTERM: Redis fsyncs its AOF and exits cleanly
        assert aof_size_bytes(tmp_path / "redis") > 10_000_000

        started_s = time.monotonic()
        server.start()
        start_s = time.monotonic() - started_s
        client = redis.Redis.from_url(server.url)  # no retry: LOADING here would raise BusyLoadingError
        assert client.info("persistence")["loading"] == 0
        assert client.xlen("stream") == NUM_ENTRIES
        assert client.get(f"key:{NUM_ENTRIES - 1}") == VALUE
        assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"
        client.close()
        print(f"start() with a {aof_size_bytes(tmp_path / 'redis') / 1e6:.1f} MB AOF returned in {start_s:.2f}s")
    finally:
        server.stop()
    assert server.exit_code() == 0


def test_transactions_survive_a_kill_9_with_acls_on(tmp_path: Path) -> None:
    """Regression: with the default user disabled AND stripped of every permission, a restarted Redis
    refused every MULTI/EXEC of its AOF at load (the replay runs as the default user and EXEC re-checks
    the ACL), silently dropping the services' transactional writes (cluster/redis_acl.py)."""
    with acl_redis_server(tmp_path) as acl:
        reward = acl.client_of("reward")
        stream, counter = acl.keys.name_of(SCORED), acl.keys.learner_decisions
        for index in range(100):
            with reward.pipeline(transaction=True) as pipe:  # MULTI ... EXEC, as StreamBus.publish_and_ack
                pipe.xadd(stream, {"data": str(index).encode()})
                pipe.hincrby(counter, "stale", 1)
                pipe.execute()
        reward.close()
        acl.server.kill()  # kill -9: the AOF (appendfsync everysec) is all that is left
        acl.server.start()
        operator = acl.client_of(OPERATOR)
        assert operator.xlen(stream) == 100
        assert operator.hget(counter, "stale") == b"100"
        assert "AOF-loading-client" not in (tmp_path / "redis" / "redis.log").read_text()
        operator.close()
