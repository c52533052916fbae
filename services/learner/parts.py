"""The learner's parts, each built from the run file and the settings; learner.py's `Learner` assembles them:

policy           the initial policy's folder loaded on every rank (policy.py: model, optimizer, precision)
collector        the `scored` consumer and its admission rule (batch.py)
weight channel   the chunk store (versions spilled to files under the run folder), the chunk server that
                 serves them and the publisher that announces them (shared/weight_channel/)
evaluator        the eval thread's engine: the workers' engine on the learner's device (evaluator.py)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.learner import lora
from services.learner.batch import BatchCollector
from services.learner.distributed import RankGroup
from services.learner.evaluator import Evaluator
from services.learner.metrics import MetricsLog
from services.learner.policy import Policy
from services.learner.settings import LearnerSettings
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.tasks import TaskAdapter
from shared.tokenization import model_fingerprint
from shared.weight_channel import ChunkServer, ChunkStore, WeightPublisher


@dataclass(frozen=True)
class WeightChannel:
    """The learner's half of the weight channel: it lives as long as the learner (Learner.__enter__/__exit__)."""

    store: ChunkStore
    server: ChunkServer
    publisher: WeightPublisher


def load_policy(model_dir: Path, run: RunConfig, ranks: RankGroup) -> Policy:
    """The policy in `model_dir`, on this rank and (sharded) on the others."""
    ranks.send_path(model_dir)  # the other ranks load it once it exists
    return Policy(model_dir, run, ranks)


def build_collector(
    run: RunConfig, settings: LearnerSettings, bus: StreamBus, keys: RunKeys, policy: Policy
) -> BatchCollector:
    """The `scored` consumer, admitting groups that fit the policy's vocabulary and context."""
    return BatchCollector(
        bus,
        keys,
        staleness_bound=run.schedule.staleness_bound,
        groups_per_step=run.grpo.groups_per_step,
        vocab_size=policy.config.vocab_size,
        max_positions=policy.config.max_position_embeddings,
        scored_block_ms=settings.scored_block_ms,
        dynamic_sampling=run.grpo.dynamic_sampling,
        trim_interval_s=settings.trim_interval_s,
        admission=run.schedule.admission,
    )


def build_weight_channel(
    run: RunConfig, settings: LearnerSettings, bus: StreamBus, keys: RunKeys, model_dir: Path, policy: Policy
) -> WeightChannel:
    """The store, the chunk server (bound, not started) and the publisher of the policy's versions."""
    run_dir = settings.run_dir
    # the versions it serves live in files under the run folder (page cache), not in the learner's memory
    store = ChunkStore(keep_versions=run.broadcast.keep_versions, spill_dir=run_dir / "published")
    server = ChunkServer(store, settings.learner_host, settings.learner_port, wait_s=run.broadcast.chunk_wait_s)
    publisher = WeightPublisher(
        bus,
        keys,
        store,
        public_url=settings.resolved_public_url(server.port),
        signing_key=settings.private_key(),
        chunk_size_bytes=run.broadcast.chunk_size_bytes,
        full_every=run.broadcast.full_every if run.broadcast.delta else 1,
        journal_path=run_dir / "broadcast.jsonl",
        model_fingerprint=model_fingerprint(model_dir),
        lora=lora.adapter_spec(run.lora, model_dir) if run.lora.enabled else None,
        dtype=policy.precision.publish_dtype,
    )
    return WeightChannel(store=store, server=server, publisher=publisher)


def build_evaluator(
    run: RunConfig, model_dir: Path, policy: Policy, task: TaskAdapter, metrics: MetricsLog, wall_s: Callable[[], float]
) -> Evaluator:
    """The eval thread: the workers' engine, on the learner's device, in the published dtype; its records go to
    `metrics` (metrics.jsonl)."""
    return Evaluator.for_model_folder(
        model_dir,
        policy.precision.device,
        policy.precision.publish_dtype,
        task,
        task_config=run.task,
        verifier_timeout_s=run.reward.verifier_timeout_s,
        max_new_tokens=run.grpo.max_new_tokens,
        on_record=metrics.append,
        wall_s=wall_s,
    )
