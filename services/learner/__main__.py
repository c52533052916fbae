"""python -m services.learner: the GRPO learner (consumes `scored`, publishes policy versions).

Reads the RL_* environment variables `--help` lists (services/learner/settings.py); RL_SIGNING_KEY is
required (`python -m shared.signing generate`).

Writes into RL_RUN_DIR: metrics.jsonl, checkpoints/latest.pt, learner_summary.json, model_final/.
SIGTERM / SIGINT: finish the step in progress, checkpoint, stop the chunk server, exit 0.

Sharded over G processes (docs/distributed_learner.md):
    python -m torch.distributed.run --nproc-per-node=G [--nnodes N --node-rank R --rdzv-endpoint H:P] -m services.learner
Rank 0 is the learner above (Redis, chunk server, metrics port, run files); the other ranks hold no
connection and bind no port, and ignore SIGTERM / SIGINT: rank 0's stop (after its checkpoint) ends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.service_entry import on_stop_signal, parse_cli, start_service

if TYPE_CHECKING:
    from services.learner.distributed import RankGroup
    from services.learner.settings import LearnerSettings
    from shared.config import RunConfig

COLLECTIVE_SLACK_S = 600.0  # a follower's collective timeout beyond the run's wall budget


def main(argv: Sequence[str] | None = None) -> None:
    from services.learner.settings import LearnerSettings

    parse_cli("python -m services.learner", __doc__, argv, settings=LearnerSettings)

    settings, run = start_service("learner", LearnerSettings)

    import torch  # heavy: only after --help and the settings are through

    torch.set_num_threads(settings.torch_num_threads)
    from services.learner.distributed import init_ranks, teardown

    # followers wait for rank 0 between steps, which takes at most the run's wall budget
    ranks = init_ranks(run.learner.device, timeout_s=run.schedule.max_wall_s + COLLECTIVE_SLACK_S)
    try:
        if ranks.is_leader:
            lead(settings, run, ranks)
        else:
            follow(run, ranks)
    finally:
        teardown(ranks)


def lead(settings: LearnerSettings, run: RunConfig, ranks: RankGroup) -> None:
    """The learner proper (rank 0 of a sharded one)."""
    from services.learner.learner import Learner
    from shared.bus import StreamBus, connect
    from shared.keys import RunKeys

    keys = RunKeys(run.run_id)
    bus = StreamBus(connect(settings.redis_url), keys, service="learner")
    learner = Learner(run, settings, bus, ranks)
    from shared.metrics import CallbackCollector, learner_families, start_metrics_server

    start_metrics_server(
        settings.metrics_port,
        CallbackCollector(lambda: learner_families(learner.state)),
        host=settings.metrics_host,
    )
    on_stop_signal(learner.request_stop)
    with learner:
        learner.run()


def follow(run: RunConfig, ranks: RankGroup) -> None:
    """A rank other than 0: the same policy's shard, driven by rank 0's commands until it stops."""
    import signal

    from services.learner.policy import Policy

    # torchrun passes a SIGTERM to every rank; rank 0 finishes its step and checkpoints with this
    # rank's help, then tells it to stop: dying on the signal would hang rank 0's collectives.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model_dir = ranks.receive_path()
    Policy(model_dir, run, ranks).follow()


if __name__ == "__main__":
    main()
