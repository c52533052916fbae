"""A real local cluster run, measured for the simulator: what simulator/validation.py takes as data.

    steps, polls, pipeline, run = run_cluster(name, config, num_workers, overrides, runs_dir)
    measured = measure_run(run, steps, polls, warmup_steps, pipeline)      # simulator/validation.py
    row = predict(run, measured, reward_poll_s=0.05, max_groups_per_batch=16)

The run is the runner's (cluster/local.py), with the coordinator's /v1/dashboard polled once a second while it
runs. The simulator imports no runner: the benchmarks that measure real runs (simulator_validation.py, wan.py,
continuous_cluster.py, ablation/cells.py) start them here and hand the simulator their records.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from cluster.local import ClusterOptions, LocalCluster
from shared.api import DashboardResponse
from shared.bus import StreamBus, connect
from shared.config import RunConfig, load_run_config
from shared.keys import RunKeys
from shared.run_records import StepRecord, read_metrics
from simulator.validation import measure_pipeline


def run_cluster(
    name: str,
    config: Path,
    num_workers: int,
    overrides: dict[str, int],
    runs_dir: Path,
    worker_env: dict[str, dict[str, str]] | None = None,
    worker_scrapes: list[tuple[float, str, str]] | None = None,
    on_streams: Callable[[StreamBus], None] | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[list[StepRecord], list[DashboardResponse], dict[str, Any], RunConfig]:
    """One real local cluster run; returns its step records, the dashboard polls, its data-plane latencies
    (`measure_pipeline`) and its run config. `worker_env`: extra environment by worker name (worker-0...).
    `worker_scrapes`, if given, gets (unix time, worker name, its /metrics text) for every worker at every
    poll (once a second). `on_streams`, if given, reads the run's streams when it has ended, before its
    Redis stops. `options`: more ClusterOptions fields (e.g. `wan`, `tls`: benchmarks/wan.py)."""
    base = load_run_config(config)
    config_path = runs_dir / f"{name}.toml"
    text = config.read_text()
    for key, value in overrides.items():  # a top-level key of a section: `key = old` -> `key = new`
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.MULTILINE)
    config_path.write_text(text)
    cluster = LocalCluster(
        ClusterOptions(
            config_path=config_path,
            num_workers=num_workers,
            runs_dir=runs_dir,
            run_id=f"{base.run_id}-{name}",
            worker_env=worker_env or {},
            **(options or {}),
        )
    )
    polls: list[DashboardResponse] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            if not cluster.coordinator_url:
                continue
            try:
                response = httpx.get(
                    cluster.coordinator_url + "/v1/dashboard", timeout=5.0, verify=cluster.coordinator_verify()
                )
                polls.append(DashboardResponse.model_validate_json(response.raise_for_status().content))
            except (httpx.HTTPError, ValueError):  # ValueError: pydantic's ValidationError
                pass
            if worker_scrapes is not None:
                scrape_workers(cluster, worker_scrapes)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        cluster.start()
        cluster.wait_until_done()
        assert cluster.redis is not None
        bus = StreamBus(connect(cluster.redis_url_for("operator")), RunKeys(cluster.run.run_id), service="validation")
        pipeline = measure_pipeline(bus)
        if on_streams is not None:
            on_streams(bus)
        bus.redis.close()
    finally:
        stop.set()
        poller.join(timeout=10)
        cluster.stop()
    steps, _ = read_metrics(cluster.run_dir / "metrics.jsonl")
    return steps, polls, pipeline, cluster.run


def scrape_workers(cluster: LocalCluster, out: list[tuple[float, str, str]]) -> None:
    """Every rollout worker's /metrics text now (a worker restarting or gone is skipped)."""
    for name, url in list(cluster.metrics_urls.items()):
        if name.startswith("worker"):
            try:
                out.append((time.time(), name, httpx.get(url, timeout=5.0).raise_for_status().text))
            except httpx.HTTPError:
                pass
