"""Rollout worker: samples GRPO groups for the tasks on the `tasks` stream with the newest announced,
verified policy weights, and publishes them to `rollouts`.

    RL_COORDINATOR_URL=http://<host>:<port> RL_REDIS_URL=redis://<host>:<port>/0 RL_WEIGHTS_PUBLIC_KEY=...
    RL_JOIN_TOKEN=<the cluster's join token> RL_RUN_CONFIG=<run.toml> RL_RUN_ID=<run id>
    RL_MODEL_DIR=<model folder> python -m services.rollout

(`python -m cluster.join` does this with the settings of the newest local cluster, runs/latest/cluster.env.)
RL_REDIS_URL needs no credentials where the coordinator runs with RL_REDIS_ACL=true: registration issues
this worker its own Redis user (and the URL to use), and no Redis connection is opened before that.

Reads: the run file (RL_RUN_CONFIG), tasks and weight announcements from Redis, weight chunks over
HTTP, the coordinator's staleness verdicts. Writes: rollouts and dead letters to Redis, heartbeats to
the coordinator; serves the weight chunks it holds on its own chunk server. SIGTERM/SIGINT finish the
current batch, deregister and exit 0; so does a drain (POST /v1/workers/<id>/drain): the heartbeat
answer says "draining". "standby" in that answer: no tasks, weights kept fresh, heartbeats go on.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

from shared.service_entry import on_stop_signal, parse_cli, start_service

log = logging.getLogger("services.rollout")


def main(argv: Sequence[str] | None = None) -> int:
    from services.rollout.settings import RolloutSettings, describe_environment

    parse_cli("python -m services.rollout", __doc__, argv, epilog="environment:\n" + describe_environment())
    # a missing or malformed RL_WEIGHTS_PUBLIC_KEY fails here, before anything starts
    settings, run = start_service("rollout", RolloutSettings)
    log.info(
        "model folder %s, engine %s",
        settings.resolved_model_dir(run.model),
        settings.worker_engine or run.rollout.engine,
    )

    stopping = threading.Event()  # set: finish the current batch, deregister, exit
    on_stop_signal(stopping.set)

    from services.rollout.worker import RolloutWorker, build_engine
    from shared.bus import connect

    engine = build_engine(settings, run)
    log.info("model fingerprint %s (weights published for another are refused)", engine.model_fingerprint[:12])
    worker = RolloutWorker(run, settings, engine, connect(settings.redis_url), stopping)
    from services.rollout.prometheus import rollout_families
    from shared.metrics import CallbackCollector, start_metrics_server

    start_metrics_server(
        settings.metrics_port,
        CallbackCollector(lambda: rollout_families(settings.worker_name, worker.report(), worker.swap_pauses)),
        host=settings.metrics_host,
    )
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
