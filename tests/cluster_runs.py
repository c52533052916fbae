"""A whole local cluster run for e2e tests: start, wait for the learner to finish, stop, report, and check
that every process it started is gone (reaped by PID)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from cluster.local import ClusterOptions, LocalCluster
from cluster.report import write_report
from cluster.run_report import RunReport, load_report


def run_to_completion(
    options: ClusterOptions, while_running: Callable[[LocalCluster], None] | None = None
) -> tuple[LocalCluster, RunReport]:
    """The finished cluster and its report.json, read back as every reader reads it. `while_running`: called
    once every service has started, before waiting for the learner to finish."""
    cluster = LocalCluster(options)
    try:
        cluster.start()
        if while_running is not None:
            while_running(cluster)
        status = cluster.wait_until_done()
    finally:
        cluster.stop()
    write_report(cluster.run_dir, cluster.run, status, wall_s=0.0)
    report = load_report(cluster.run_dir / "report.json")
    assert cluster.redis is not None and cluster.redis.process is not None
    for pid in [process.pid for process in cluster.services.values()] + [cluster.redis.process.pid]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # every child is gone (reaped), none left behind
    return cluster, report
