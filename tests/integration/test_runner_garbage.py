"""The local runner against garbage, on the Redis it starts itself (cluster/local.py): malformed entries in
every stream (dead letters included) and in the learner state cannot stop it from writing accounting.json
and report.json, and Redis is stopped by PID whatever happens; its ACL file stays 0600 after ACL SAVE."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import redis

from cluster.accounting import GroupAccounting
from cluster.local import ClusterOptions, LocalCluster
from cluster.redis_acl import OPERATOR
from cluster.report import write_report
from cluster.run_report import load_report
from shared import streams
from shared.bus import StreamBus, connect
from shared.keys import RunKeys
from shared.streams import LEARNER_STATE, Stream

pytestmark = pytest.mark.integration

GARBAGE = [b"\xff\x00 not msgpack", b"", b"\x93\x01\x02\x03", os.urandom(4096)]


def runner(repo_root: Path, tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(
        ClusterOptions(config_path=repo_root / "tests/e2e/cluster_test.toml", runs_dir=tmp_path / "runs")
    )
    cluster.run_dir.mkdir(parents=True)
    cluster.start_redis()
    return cluster


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_garbage_in_every_stream_cannot_stop_the_accounting_the_report_or_redis_stopping(
    repo_root: Path, tmp_path: Path
) -> None:
    cluster = runner(repo_root, tmp_path)
    assert cluster.redis is not None
    pid = cluster.redis.pid
    try:
        client = connect(cluster.redis_url_for(OPERATOR))
        bus = StreamBus(client, RunKeys(cluster.run.run_id), service="garbage")
        every_stream = [value for value in vars(streams).values() if isinstance(value, Stream)]
        assert {stream.name for stream in every_stream} >= {"tasks", "rollouts", "scored", "weights", "dead"}
        for stream in every_stream:
            for payload in GARBAGE:
                bus.publish_raw(stream, payload)
            client.xadd(bus.keys.name_of(stream), {b"not-data": b"x"})  # an entry without the payload field
            if stream.group is not None:  # some garbage delivered and left pending, as a crashed consumer would
                bus.ensure_group(stream)
                client.xreadgroup(stream.group, "crashed", {bus.keys.name_of(stream): ">"}, count=2)
        client.set(bus.keys.name_of(LEARNER_STATE), b"\xffgarbage")
        client.hset(bus.keys.learner_decisions, "stale", b"not a number")
        client.close()
    finally:
        cluster.stop()

    assert not pid_alive(pid), "redis-server left running"
    assert cluster.redis.exit_code() is not None
    accounting = GroupAccounting.model_validate_json((cluster.run_dir / "accounting.json").read_text())
    assert accounting.streams["tasks"].num_added == len(GARBAGE) + 1
    assert accounting.num_pending_reward == len(GARBAGE) + 1  # garbage nobody consumed is pending, not lost
    assert any("learner state" in problem for problem in accounting.problems)
    assert any("not a count" in problem for problem in accounting.problems)
    write_report(cluster.run_dir, cluster.run, None, wall_s=1.0)
    report = load_report(cluster.run_dir / "report.json")
    assert report.accounting is not None
    assert report.accounting.num_unleased == len(GARBAGE) + 1 - 2  # two were delivered (held)


def test_redis_is_stopped_even_when_the_accounting_cannot_be_read(repo_root: Path, tmp_path: Path) -> None:
    cluster = runner(repo_root, tmp_path)
    assert cluster.redis is not None
    pid = cluster.redis.pid
    cluster.redis_users.passwords[OPERATOR] = "wrong"  # every read of the accounting fails
    cluster.stop()
    assert not pid_alive(pid)
    assert not (cluster.run_dir / "accounting.json").exists()
    assert (cluster.run_dir / "supervision.json").exists()


def test_the_acl_file_stays_private_after_redis_rewrites_it(repo_root: Path, tmp_path: Path) -> None:
    cluster = runner(repo_root, tmp_path)
    acl_file = cluster.run_dir / "redis" / "users.acl"
    try:
        assert stat.S_IMODE(acl_file.stat().st_mode) == 0o600
        operator = redis.Redis.from_url(cluster.redis_url_for(OPERATOR))
        inode_before = acl_file.stat().st_ino
        operator.acl_setuser("someone", enabled=True, passwords=["+pw"], keys=["rl:x:*"], commands=["+get"])
        operator.execute_command("ACL", "SAVE")
        operator.close()
        assert acl_file.stat().st_ino != inode_before  # Redis wrote a new file and renamed it over the old
        assert "someone" in acl_file.read_text()
        assert stat.S_IMODE(acl_file.stat().st_mode) == 0o600
        for path in (cluster.run_dir / "redis").rglob("*"):  # the AOF and the log too
            if path.is_file():
                assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    finally:
        cluster.stop()
