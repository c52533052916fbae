"""Rollout worker: samples GRPO groups for the tasks the coordinator leases it with the newest announced,
verified policy weights, and hands them back to the coordinator.

    RL_COORDINATOR_URL=https://<host>:<port> RL_COORDINATOR_CA_FILE=<the run's ca.pem> RL_WEIGHTS_PUBLIC_KEY=...
    RL_JOIN_TOKEN=<the cluster's join token> RL_RUN_CONFIG=<run.toml> RL_RUN_ID=<run id> RL_MODEL_DIR=<model folder>
    python -m services.rollout

A plain http:// coordinator URL is refused unless its host is loopback (127.0.0.0/8, ::1, localhost) or
RL_INSECURE_HTTP=1: the worker's tokens cross only TLS off this machine (shared/tls.py).

(`python -m cluster.join` does this with the settings of the newest local cluster, runs/latest/cluster.env.)
A worker holds no Redis credentials and opens no Redis connection: everything goes through the coordinator.

Reads: the run file (RL_RUN_CONFIG), tasks (POST /v1/work/lease) and weight announcements (a long poll)
from the coordinator, weight chunks over HTTP, the coordinator's staleness verdicts. Writes: rollouts
(POST /v1/work/rollouts) and tasks it cannot serve (POST /v1/work/failures) and heartbeats to the
coordinator; serves the weight chunks it holds on its own chunk server. SIGTERM/SIGINT finish the
current batch, deregister and exit 0; so does a drain (POST /v1/workers/<id>/drain): the heartbeat
answer says "draining". "standby" in that answer: no tasks, weights kept fresh, heartbeats go on.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shared.service_entry import on_stop_signal, parse_cli, start_service

if TYPE_CHECKING:
    from engines.interface import InferenceEngine
    from services.rollout.settings import RolloutSettings
    from shared.config import RunConfig
    from shared.weight_channel import ChunkStore

log = logging.getLogger("services.rollout")

# What a worker is built with, given the engine the run file names: the engine it samples with and its
# chunk store (None: the honest ChunkStore). The service passes none (the engine as built, the honest
# store); the trust tests' lying workers (benchmarks/liar_worker.py) pass wrappers.
WorkerParts = Callable[
    ["RunConfig", "RolloutSettings", "InferenceEngine"], tuple["InferenceEngine", "ChunkStore | None"]
]


def main(argv: Sequence[str] | None = None) -> int:
    from services.rollout.settings import RolloutSettings

    parse_cli("python -m services.rollout", __doc__, argv, settings=RolloutSettings)
    return serve()


def serve(parts: WorkerParts | None = None) -> int:
    """Start a worker from the RL_* settings and serve until stopped; `parts` may replace its engine and store."""
    from services.rollout.settings import RolloutSettings

    # a missing or malformed RL_WEIGHTS_PUBLIC_KEY fails here, before anything starts
    settings, run = start_service("rollout", RolloutSettings)
    try:  # before the engine loads: plain http to another host, or an unreadable CA file, is one line
        settings.coordinator_verify()
    except ValueError as exc:
        sys.exit(f"rollout: {exc}")
    log.info(
        "model folder %s, engine %s",
        settings.resolved_model_dir(run.model),
        settings.worker_engine or run.rollout.engine,
    )

    stopping = threading.Event()  # set: finish the current batch, deregister, exit
    on_stop_signal(stopping.set)

    from services.rollout.worker import RolloutWorker, build_engine

    engine = build_engine(settings, run)
    log.info("model fingerprint %s (weights published for another are refused)", engine.model_fingerprint[:12])
    store = None
    if parts is not None:
        engine, store = parts(run, settings, engine)
    worker = RolloutWorker(run, settings, engine, stopping, store=store)
    from services.rollout.prometheus import rollout_families
    from shared.metrics import CallbackCollector, start_metrics_server

    start_metrics_server(
        settings.metrics_port,
        CallbackCollector(
            lambda: rollout_families(settings.worker_name, worker.report(), worker.swap_pauses, worker.occupancy)
        ),
        host=settings.metrics_host,
    )
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
