"""python -m services.reward: the data plane (prompts out, scored groups in). Needs no torch.

Reads the RL_* environment variables `--help` lists (services/reward/settings.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from shared.service_entry import on_stop_signal, parse_cli, start_service

log = logging.getLogger("services.reward")


def main(argv: Sequence[str] | None = None) -> None:
    from services.reward.settings import RewardSettings

    parse_cli("python -m services.reward", __doc__, argv, settings=RewardSettings)
    from services.reward.service import RewardService
    from shared.bus import StreamBus, connect
    from shared.keys import RunKeys

    settings, run = start_service("reward", RewardSettings)
    log.info(
        "task %s, %d groups in flight (before dynamic sampling's widening)", run.task.name, run.max_groups_in_flight
    )
    keys = RunKeys(run.run_id)
    bus = StreamBus(connect(settings.redis_url), keys, service="reward")
    service = RewardService(run, settings, bus)
    from services.reward.prometheus import reward_families
    from shared.metrics import CallbackCollector, start_metrics_server, stream_depth_families

    start_metrics_server(
        settings.metrics_port,
        CallbackCollector(
            lambda: [
                *reward_families(
                    service.num_scored,
                    service.num_tasks_published,
                    service.scorer.text_mismatches_by_worker,
                    service.scorer.verifier_failures_by_kind,
                    service.scorer.verifiers.num_replaced,
                    service.scorer.rejected_by_worker,
                    service.scorer.env_reward_mismatches_by_worker,
                ),
                *stream_depth_families(bus),
            ]
        ),
        host=settings.metrics_host,
    )
    on_stop_signal(service.stop_event.set)
    service.run_forever()
    log.info("stopped after scoring %d groups", service.num_scored)


if __name__ == "__main__":
    main()
