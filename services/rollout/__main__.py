"""Rollout worker: samples GRPO groups for the tasks on the `tasks` stream with the newest announced,
verified policy weights, and publishes them to `rollouts`.

    RL_COORDINATOR_URL=http://<host>:<port> RL_REDIS_URL=redis://<host>:<port>/0 RL_CLUSTER_KEY=...
    RL_RUN_CONFIG=<run.toml> RL_RUN_ID=<run id> RL_MODEL_DIR=<model folder> python -m services.rollout

(`python -m cluster.join` does this with the settings of the newest local cluster, runs/latest/cluster.env.)

Reads: the run file (RL_RUN_CONFIG), tasks and weight announcements from Redis, weight chunks over
HTTP, the coordinator's staleness verdicts. Writes: rollouts and dead letters to Redis, heartbeats to
the coordinator; serves the weight chunks it holds on its own chunk server. SIGTERM/SIGINT finish the
current batch, deregister and exit 0; so does a drain (POST /v1/workers/<id>/drain): the heartbeat
answer says "draining". "standby" in that answer: no tasks, weights kept fresh, heartbeats go on.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import types

log = logging.getLogger("services.rollout")


def parse_args(argv: list[str]) -> argparse.Namespace:
    from services.rollout.settings import describe_environment

    parser = argparse.ArgumentParser(
        prog="python -m services.rollout",
        description=__doc__,
        epilog="environment:\n" + describe_environment(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parse_args(sys.argv[1:] if argv is None else argv)
    from services.rollout.settings import RolloutSettings

    settings = RolloutSettings()  # a missing RL_CLUSTER_KEY fails here, before anything starts
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat and chunk otherwise
    run = settings.load_run()
    log.info("settings: %s", settings.model_dump(mode="json"))
    log.info("run %s: rollout %s, broadcast %s", run.run_id, run.rollout.model_dump(), run.broadcast.model_dump())
    log.info("model folder %s, engine %s", settings.resolved_model_dir, settings.worker_engine)

    stopping = threading.Event()

    def request_stop(signum: int, frame: types.FrameType | None) -> None:
        log.info("received %s; finishing the current batch", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    from services.rollout.worker import RolloutWorker, build_engine
    from shared.bus import connect

    engine = build_engine(settings)
    worker = RolloutWorker(run, settings, engine, connect(settings.redis_url), stopping)
    from services.rollout.prometheus import rollout_families
    from shared.metrics import CallbackCollector, start_metrics_server

    start_metrics_server(
        settings.metrics_port, CallbackCollector(lambda: rollout_families(settings.worker_name, worker.report()))
    )
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
