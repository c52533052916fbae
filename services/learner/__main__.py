"""python -m services.learner: the GRPO learner (consumes `scored`, publishes policy versions).

Environment: RL_REDIS_URL, RL_RUN_CONFIG, RL_RUN_ID, RL_RUN_DIR, RL_MODEL_DIR (default
the run file's [model] path, else <run_dir>/model, built there only with [model] init = "tiny-random"),
RL_SIGNING_KEY (required: the Ed25519 private key, `python -m shared.signing generate`), RL_LEARNER_HOST, RL_LEARNER_PORT,
RL_LEARNER_PUBLIC_URL, RL_POLL_BLOCK_MS, RL_TORCH_NUM_THREADS, RL_LOG_LEVEL, RL_METRICS_PORT
(Prometheus /metrics; 0: off).

Writes into RL_RUN_DIR: metrics.jsonl, checkpoints/latest.pt, learner_summary.json, model_final/.
SIGTERM / SIGINT: finish the step in progress, checkpoint, stop the chunk server, exit 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.service_entry import on_stop_signal, parse_cli, start_service


def main(argv: Sequence[str] | None = None) -> None:
    parse_cli("python -m services.learner", __doc__, argv)
    from services.learner.settings import LearnerSettings

    settings, run = start_service("learner", LearnerSettings)

    import torch  # heavy: only after --help and the settings are through

    torch.set_num_threads(settings.torch_num_threads)
    from services.learner.learner import Learner
    from shared.bus import StreamBus, connect
    from shared.keys import RunKeys

    keys = RunKeys(run.run_id)
    bus = StreamBus(connect(settings.redis_url), keys, service="learner")
    learner = Learner(run, settings, bus)
    from shared.metrics import CallbackCollector, learner_families, start_metrics_server

    start_metrics_server(settings.metrics_port, CallbackCollector(lambda: learner_families(learner.state)))
    on_stop_signal(learner.request_stop)
    with learner:
        learner.run()


if __name__ == "__main__":
    main()
