"""python -m services.reward: the data plane (prompts out, scored groups in). Needs no torch.

Environment: RL_REDIS_URL, RL_RUN_CONFIG, RL_RUN_ID, RL_CONSUMER_NAME, RL_POLL_BLOCK_MS,
RL_CLAIM_IDLE_MS, RL_REFERENCE_TTL_S, RL_LOG_LEVEL, RL_METRICS_PORT (Prometheus /metrics; 0: off).
"""

from __future__ import annotations

import argparse
import logging
import signal


def main() -> None:
    argparse.ArgumentParser(
        prog="python -m services.reward", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    from services.reward.service import RewardService
    from services.reward.settings import RewardSettings
    from shared.bus import StreamBus, connect
    from shared.keys import RunKeys

    settings = RewardSettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s reward %(levelname)s %(message)s")
    run = settings.load_run()
    logging.info("resolved settings: %s", settings.model_dump_json())
    logging.info("run %s: task %s, %d groups in flight max", run.run_id, run.task.name, run.max_groups_in_flight)
    keys = RunKeys(run.run_id)
    bus = StreamBus(connect(settings.redis_url), keys, service="reward")
    service = RewardService(run, settings, bus)
    from shared.metrics import CallbackCollector, reward_families, start_metrics_server, stream_depth_families

    start_metrics_server(
        settings.metrics_port,
        CallbackCollector(
            lambda: [
                *reward_families(service.num_scored, service.num_tasks_published),
                *stream_depth_families(bus),
            ]
        ),
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: service.stop_event.set())
    service.run_forever()
    logging.info("stopped after scoring %d groups", service.num_scored)


if __name__ == "__main__":
    main()
