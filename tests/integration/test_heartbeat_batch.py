"""The heartbeat hot path's Redis layer against a real redis-server: the one-script connection
(services/coordinator/redis_script.py) and the batcher that coalesces concurrent heartbeats into one call
(services/coordinator/heartbeat_batch.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from cluster.ports import free_port
from cluster.redis_server import RedisServer
from services.coordinator.heartbeat_batch import DEAD, OK, UNKNOWN, WRONG_TOKEN, HeartbeatBatcher, HeartbeatEntry
from services.coordinator.redis_script import ScriptConnection, pack_command
from services.coordinator.worker_registry import WorkerRegistry
from shared.api import RegisterWorkerRequest, WeightSwapReport, WorkerState
from shared.keys import RunKeys
from tests.coordinator_rest import announce

pytestmark = pytest.mark.integration

ECHO_LUA = "redis.call('SET', KEYS[1], ARGV[1]); return {redis.call('GET', KEYS[1]), #KEYS, tonumber(ARGV[2]) * 2}"


def test_pack_command_is_a_resp_array_of_bulk_strings() -> None:
    assert pack_command("SET", "k", b"v\r\n1") == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\nv\r\n1\r\n"


def test_script_connection_dials_what_the_client_url_says() -> None:
    tls = ScriptConnection.like(redis.Redis.from_url("rediss://:secret@redis.example:6380/2"), ECHO_LUA)
    assert (tls.tls, tls.host, tls.port, tls.db, tls.password) == (True, "redis.example", 6380, 2, "secret")
    unix = ScriptConnection.like(redis.Redis.from_url("unix:///run/redis.sock?db=1"), ECHO_LUA)
    assert (unix.tls, unix.unix_socket_path, unix.db) == (False, "/run/redis.sock", 1)


def test_script_runs_by_sha_after_loading_itself_once(redis_client: redis.Redis, keys: RunKeys) -> None:
    redis_client.script_flush()
    connection = ScriptConnection.like(redis_client, ECHO_LUA)

    async def calls() -> list:
        try:
            return [await connection.call([keys.prefix + "echo"], ["hello", str(n)]) for n in (1, 2)]
        finally:
            await connection.close()

    assert asyncio.run(calls()) == [[b"hello", 1, 2], [b"hello", 1, 4]]
    assert redis_client.script_exists(connection.sha1) == [True]  # the NOSCRIPT fallback loaded it
    assert redis_client.get(keys.prefix + "echo") == b"hello"


def test_script_error_reply_is_a_response_error_and_the_connection_stays_usable(
    redis_client: redis.Redis, keys: RunKeys
) -> None:
    connection = ScriptConnection.like(redis_client, ECHO_LUA)

    async def calls() -> tuple[str, list]:
        try:
            with pytest.raises(redis.ResponseError) as failed:
                await connection.call([keys.prefix + "echo"], ["x", "not a number"])
            return str(failed.value), await connection.call([keys.prefix + "echo"], ["y", "3"])
        finally:
            await connection.close()

    message, after = asyncio.run(calls())
    assert "arithmetic" in message or "number" in message
    assert after == [b"y", 1, 6]


def test_script_connection_selects_the_clients_database(redis_server: RedisServer, keys: RunKeys) -> None:
    db3 = redis.Redis.from_url(redis_server.url.rsplit("/", 1)[0] + "/3")
    connection = ScriptConnection.like(db3, ECHO_LUA)

    async def call() -> None:
        try:
            await connection.call([keys.prefix + "in-db-3"], ["there", "1"])
        finally:
            await connection.close()

    try:
        asyncio.run(call())
        assert db3.get(keys.prefix + "in-db-3") == b"there"
        assert redis.Redis.from_url(redis_server.url).get(keys.prefix + "in-db-3") is None
    finally:
        db3.delete(keys.prefix + "in-db-3")
        db3.close()


def test_lost_redis_is_a_connection_error_and_the_next_call_dials_again(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", port=free_port()).start()
    connection = ScriptConnection.like(redis.Redis.from_url(server.url), ECHO_LUA)

    async def before_during_after() -> list:
        outcomes = [await connection.call(["k"], ["before", "1"])]
        server.stop()
        with pytest.raises(redis.ConnectionError):
            await connection.call(["k"], ["during", "1"])
        server.start()  # same port; a restarted Redis has no scripts cached: NOSCRIPT, then EVAL
        outcomes.append(await connection.call(["k"], ["after", "1"]))
        await connection.close()
        return outcomes

    try:
        assert asyncio.run(before_during_after()) == [[b"before", 1, 2], [b"after", 1, 2]]
    finally:
        server.stop()


def test_unreachable_redis_is_a_connection_error() -> None:
    connection = ScriptConnection(ECHO_LUA, host="127.0.0.1", port=free_port())
    with pytest.raises(redis.ConnectionError):
        asyncio.run(connection.call(["k"], ["v", "1"]))


def entry(
    worker_id: str, digest: str, now_s: float, *, swap_version: int | None = None, samples_per_s: float = 1.0
) -> HeartbeatEntry:
    swap = None
    if swap_version is not None:
        swap = WeightSwapReport(
            policy_version=swap_version, announced_at_s=now_s - 2.0, swapped_at_s=now_s - 1.0, num_bytes=8 << 20
        )
    return HeartbeatEntry(
        worker_id=worker_id,
        token_sha256=digest,
        now_s=now_s,
        expiry_s=now_s + 30.0,
        fields={"samples_per_s": repr(samples_per_s), "last_heartbeat_s": repr(now_s)},
        swap=swap,
    )


def test_concurrent_heartbeats_share_script_calls_and_each_gets_its_own_outcome(
    redis_client: redis.Redis, keys: RunKeys
) -> None:
    registry = WorkerRegistry(redis_client, keys, lease_s=30.0)
    now_s = registry.clock()
    for i in range(40):
        registry.register(f"w{i}", RegisterWorkerRequest(name=f"w{i}"), token_sha256=f"digest-{i}")
    registry.register("standby", RegisterWorkerRequest(name="s"), token_sha256="digest-s", state=WorkerState.STANDBY)
    registry.register("expired", RegisterWorkerRequest(name="e"), token_sha256="digest-e")
    redis_client.zadd(keys.worker_leases, {"expired": now_s - 1.0})  # its lease ran out a second ago
    announce(redis_client, keys.run_id, 7, now_s - 2.0)
    entries = [entry(f"w{i}", f"digest-{i}", now_s, samples_per_s=float(i)) for i in range(40)] + [
        entry("standby", "digest-s", now_s, swap_version=7),
        entry("w0", "someone-elses-digest", now_s),
        entry("nobody", "digest-x", now_s),
        entry("expired", "digest-e", now_s),
    ]
    batcher = HeartbeatBatcher(redis_client, keys)

    async def beat_all() -> list:
        try:
            return await asyncio.gather(*(batcher.submit(e) for e in entries))
        finally:
            await batcher.close()

    outcomes = asyncio.run(beat_all())

    assert [(o.code, o.state) for o in outcomes[:40]] == [(OK, "active")] * 40
    assert (outcomes[40].code, outcomes[40].state, outcomes[40].swap_is_news) == (OK, "standby", True)
    assert [o.code for o in outcomes[41:]] == [WRONG_TOKEN, UNKNOWN, DEAD]
    assert batcher.num_entries == len(entries)
    assert batcher.num_calls < len(entries) / 4  # they rode together, not one call each
    assert registry.get("w17").samples_per_s == 17.0
    assert registry.get("w17").lease_expires_at_s == pytest.approx(now_s + 30.0)
    assert registry.get("expired").state == WorkerState.DEAD
    assert redis_client.zscore(keys.worker_leases, "expired") is None
    # the standby worker's swap of version 7 is recorded for T_bcast: 8 MiB in 1 s
    assert float(redis_client.hget(keys.broadcast_swaps(7), "standby")) == pytest.approx(now_s - 1.0)
    assert redis_client.zscore(keys.broadcast_pending, "7") == pytest.approx(now_s - 2.0)
    assert float(redis_client.hget(keys.broadcast_throughput, "standby")) == pytest.approx(8 * 8 * 2**20 / 1e6)
    assert redis_client.hget(keys.broadcast_last_swap, "standby").decode() == f"7:{now_s - 1.0!r}"


def test_a_swap_is_news_once(redis_client: redis.Redis, keys: RunKeys) -> None:
    registry = WorkerRegistry(redis_client, keys, lease_s=30.0)
    registry.register("w", RegisterWorkerRequest(name="w"), token_sha256="d")
    for version in (3, 4):
        announce(redis_client, keys.run_id, version, registry.clock() - 2.0)
    batcher = HeartbeatBatcher(redis_client, keys)

    async def beat_three_times() -> list[bool]:
        try:
            return [
                (await batcher.submit(entry("w", "d", registry.clock(), swap_version=v))).swap_is_news
                for v in (3, 3, 4)
            ]
        finally:
            await batcher.close()

    assert asyncio.run(beat_three_times()) == [True, False, True]


def test_a_failed_call_fails_the_heartbeats_that_rode_it_and_the_batcher_recovers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", port=free_port()).start()
    client = redis.Redis.from_url(server.url)
    keys = RunKeys("batch-recovery")
    registry = WorkerRegistry(client, keys, lease_s=30.0)
    registry.register("w", RegisterWorkerRequest(name="w"), token_sha256="d")
    batcher = HeartbeatBatcher(client, keys)

    async def across_an_outage() -> tuple[list, int]:
        server.stop()
        failed = await asyncio.gather(
            *(batcher.submit(entry("w", "d", registry.clock())) for _ in range(5)), return_exceptions=True
        )
        server.start()
        ok = await batcher.submit(entry("w", "d", registry.clock()))
        await batcher.close()
        return failed, ok.code

    try:
        failed, code_after = asyncio.run(across_an_outage())
        assert all(isinstance(outcome, redis.ConnectionError) for outcome in failed)
        assert code_after == OK
    finally:
        client.close()
        server.stop()


def test_a_swap_is_timed_from_the_publication_start_its_rate_from_the_announcement(
    redis_client: redis.Redis, keys: RunKeys
) -> None:
    registry = WorkerRegistry(redis_client, keys, lease_s=30.0)
    now_s = registry.clock()
    registry.register("w", RegisterWorkerRequest(name="w"), token_sha256="d")
    announce(redis_client, keys.run_id, 7, now_s - 2.0, publish_started_at_s=now_s - 4.0)  # published for 2 s
    swap = WeightSwapReport(
        policy_version=7,
        announced_at_s=0.0,
        swapped_at_s=now_s - 1.0,
        num_bytes=8 << 20,
        ready_at_s=now_s - 1.5,
        pause_s=0.25,
    )
    batcher = HeartbeatBatcher(redis_client, keys)

    async def beat() -> bool:
        try:
            return (await batcher.submit(replace(entry("w", "d", now_s), swap=swap))).swap_is_news
        finally:
            await batcher.close()

    assert asyncio.run(beat())
    assert redis_client.zscore(keys.broadcast_pending, "7") == pytest.approx(now_s - 4.0)
    assert redis_client.hget(keys.broadcast_swap_splits(7), "w").decode() == f"{now_s - 1.5!r}:0.25"
    assert redis_client.ttl(keys.broadcast_swap_splits(7)) > 0
    # the download rate covers the transfer only: 8 MiB in the 1 s since the announcement
    assert float(redis_client.hget(keys.broadcast_throughput, "w")) == pytest.approx(8 * 8 * 2**20 / 1e6)
