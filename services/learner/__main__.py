"""python -m services.learner: the GRPO learner (consumes `scored`, publishes policy versions).

Environment: RL_REDIS_URL, RL_RUN_CONFIG, RL_RUN_ID, RL_RUN_DIR, RL_MODEL_DIR (default
<run_dir>/model, built if missing), RL_CLUSTER_KEY (required), RL_LEARNER_HOST, RL_LEARNER_PORT,
RL_LEARNER_PUBLIC_URL, RL_POLL_BLOCK_MS, RL_TORCH_NUM_THREADS, RL_LOG_LEVEL, RL_METRICS_PORT
(Prometheus /metrics; 0: off).

Writes into RL_RUN_DIR: metrics.jsonl, checkpoints/latest.pt, learner_summary.json, model_final/.
SIGTERM / SIGINT: finish the step in progress, checkpoint, stop the chunk server, exit 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys


def main() -> None:
    argparse.ArgumentParser(
        prog="python -m services.learner", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    from pydantic import ValidationError

    from services.learner.settings import LearnerSettings

    try:
        settings = LearnerSettings()
    except ValidationError as exc:  # a missing RL_CLUSTER_KEY and the like: say which, no traceback
        sys.exit(f"learner settings (RL_* environment variables): {exc}")
    logging.basicConfig(level=settings.log_level, format="%(asctime)s learner %(levelname)s %(message)s")

    import torch  # heavy: only after --help and the settings are through

    torch.set_num_threads(settings.torch_num_threads)
    from services.learner.learner import Learner
    from shared.bus import StreamBus, connect
    from shared.keys import RunKeys

    run = settings.load_run()
    logging.info("resolved settings: %s", settings.model_dump_json())
    logging.info("run config: %s", run.model_dump_json())
    keys = RunKeys(run.run_id)
    bus = StreamBus(connect(settings.redis_url), keys, service="learner")
    learner = Learner(run, settings, bus)
    from shared.metrics import CallbackCollector, learner_families, start_metrics_server

    start_metrics_server(settings.metrics_port, CallbackCollector(lambda: learner_families(learner.state)))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: learner.request_stop())
    with learner:
        learner.run()


if __name__ == "__main__":
    main()
