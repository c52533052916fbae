"""Redis at its memory cap (cluster/redis_server.py: maxmemory, noeviction): writes are refused with an
OOM error that the services treat as an outage, a refused publish acks nothing, nothing is evicted, and
the trusted consumers' trimming (allowed even then) frees the room the writers wait for."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from cluster.redis_server import DEFAULT_MAXMEMORY_BYTES, RedisServer
from shared.bus import StreamBus, connect
from shared.keys import GROUPS_SCORED, RunKeys
from shared.retry import REDIS_OUTAGE_ERRORS
from shared.streams import DEAD, ROLLOUTS, SCORED

pytestmark = pytest.mark.integration

ENTRY = b"x" * 50_000


def test_the_runner_s_redis_is_capped_and_never_evicts(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    config = redis_client.config_get("maxmemory*")
    assert int(config["maxmemory"]) == DEFAULT_MAXMEMORY_BYTES == redis_server.maxmemory_bytes
    assert config["maxmemory-policy"] == "noeviction"


def test_at_the_cap_a_refused_publish_acks_nothing_and_trimming_makes_room(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", append_only=False, maxmemory_bytes=4 * 1024**2) as server:
        client = connect(server.url)
        keys = RunKeys("oom")
        bus = StreamBus(client, keys, service="reward")
        for stream in (ROLLOUTS, SCORED):
            bus.ensure_group(stream)
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # fill it with rollouts
            for _ in range(1000):
                bus.publish_raw(ROLLOUTS, ENTRY)
        num_rollouts = bus.length(ROLLOUTS)
        assert redis.exceptions.OutOfMemoryError in REDIS_OUTAGE_ERRORS  # waited out with backoff, not a crash

        # the reward service read them all, and its publish of the scored groups is refused whole
        deliveries = client.xreadgroup("reward", "reward-0", {keys.name_of(ROLLOUTS): ">"}, count=num_rollouts)
        delivered = [entry_id.decode() for entry_id, _ in deliveries[0][1]]
        assert len(delivered) == num_rollouts  # reads go through at the cap
        with client.pipeline(transaction=True) as pipe, pytest.raises(redis.exceptions.OutOfMemoryError):
            pipe.xadd(keys.name_of(SCORED), {b"data": ENTRY})
            pipe.xack(keys.name_of(ROLLOUTS), "reward", delivered[0])
            pipe.hincrby(keys.reward_counts, GROUPS_SCORED, 1)
            pipe.execute()
        assert client.xpending(keys.name_of(ROLLOUTS), "reward")["pending"] == num_rollouts  # nothing acked
        assert bus.length(SCORED) == 0 and not client.hgetall(keys.reward_counts)
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # a dead letter neither: its XADD comes first
            bus._dead_letter_raw(keys.name_of(ROLLOUTS), "reward", delivered[0], ENTRY, "unscorable", 1)
        assert client.xpending(keys.name_of(ROLLOUTS), "reward")["pending"] == num_rollouts
        assert bus.length(DEAD) == 0 and bus.length(ROLLOUTS) == num_rollouts  # and nothing was evicted

        # acks and trims go through at the cap; once consumed entries are trimmed, writes succeed again
        bus.ack(ROLLOUTS, delivered)
        assert bus.trim_consumed(ROLLOUTS) > 0
        bus.publish_raw(SCORED, ENTRY)
        client.close()
