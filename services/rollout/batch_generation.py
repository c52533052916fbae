"""Batch mode's generation: one turn's leased tasks through the engine, one engine call per set of sampling
parameters (one call per turn for multi-turn episodes), each group built with the worker's current
registration and signed with its rollout key. A task the engine cannot serve (EngineError) fails alone: the
batch is tried again one task at a time."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

from engines.interface import EngineError, InferenceEngine, Sampling
from services.rollout.episodes import EpisodeRunner, build_episode_group
from services.rollout.rollout_groups import build_rollout_group
from shared.api import RegisterWorkerResponse
from shared.config import TaskConfig
from shared.keyed_sampling import task_seed
from shared.messages import RolloutGroup
from shared.rollout_mac import sign_rollout
from shared.tokenization import PromptInput
from shared.work_api import LeasedTask

# What happened to one task: its group, or the engine error that made it undeliverable.
Outcome = tuple[LeasedTask, RolloutGroup | EngineError]

# one engine call (continuous mode: one decoding step): (num_samples, generation_s, num_tokens, num_places)
RecordGeneration = Callable[[int, float, int, int], None]


class BatchGenerator:
    def __init__(
        self,
        engine: InferenceEngine,
        task: TaskConfig,
        max_groups_per_batch: int,
        registration: Callable[[], RegisterWorkerResponse],
        record_generation: RecordGeneration,
    ) -> None:
        """`max_groups_per_batch`: the engine's batch in groups, what its occupancy is measured against;
        `registration`: the worker's current one (its id goes into each group, its key signs it)."""
        self.engine = engine
        self.task = task
        self.max_groups_per_batch = max_groups_per_batch
        self.registration = registration
        self.record_generation = record_generation
        self._episode_runner: EpisodeRunner | None = None

    def generate(self, leased: list[LeasedTask]) -> list[Outcome]:
        """Sample every task; tasks sharing sampling parameters go through the engine in one call."""
        batches: dict[tuple[Sampling, bool], list[LeasedTask]] = defaultdict(list)
        for lease in leased:
            is_episode = lease.task.environment is not None  # multi-turn: played by services/rollout/episodes.py
            batches[(Sampling.of_task(lease.task), is_episode)].append(lease)
        outcomes: list[Outcome] = []
        for batch in batches.values():
            outcomes.extend(self._generate_batch(batch))
        return outcomes

    def episode_runner(self) -> EpisodeRunner:
        """Plays multi-turn tasks; built on the first one (it builds the run's task adapter)."""
        if self._episode_runner is None:
            self._episode_runner = EpisodeRunner(self.engine, self.task)
        return self._episode_runner

    def _generate_batch(self, batch: list[LeasedTask]) -> list[Outcome]:
        """One engine call for the batch (one per turn for episodes); if it fails, one call per task so a
        bad task fails alone."""
        policy_version = self.engine.policy_version
        try:
            if batch[0].task.environment is None:
                built, registration = self._sample_groups(batch, policy_version)
            else:
                built, registration = self._play_episodes(batch, policy_version)
        except EngineError as exc:
            if len(batch) == 1:
                return [(batch[0], exc)]
            return [outcome for lease in batch for outcome in self._generate_batch([lease])]
        rollout_key = bytes.fromhex(registration.access.rollout_key_hex)
        return [(lease, sign_rollout(group, rollout_key)) for lease, group in zip(batch, built, strict=True)]

    def _sample_groups(
        self, batch: list[LeasedTask], policy_version: int
    ) -> tuple[list[RolloutGroup], RegisterWorkerResponse]:
        """Single-turn tasks: every sample of every task in one engine call."""
        sampling = Sampling.of_task(batch[0].task)
        started_s = time.perf_counter()
        groups = self.engine.generate(
            [PromptInput.of_task(lease.task) for lease in batch],
            sampling,
            # keyed sampling: each task's seeds come from its id, so the learner can check how tokens were chosen
            sampling_seeds=[task_seed(lease.task.task_id) for lease in batch],
        )
        generation_s = time.perf_counter() - started_s
        num_tokens = sum(s.num_tokens for samples in groups for s in samples)
        capacity_rows = self.max_groups_per_batch * sampling.num_samples
        self.record_generation(
            sum(len(samples) for samples in groups),
            generation_s,
            num_tokens,
            capacity_rows * max(s.num_tokens for samples in groups for s in samples),
        )
        registration = self.registration()  # the id and its key from the same registration
        built = [
            build_rollout_group(lease.task, samples, registration.worker_id, policy_version, generation_s)
            for lease, samples in zip(batch, groups, strict=True)
        ]
        return built, registration

    def _play_episodes(
        self, batch: list[LeasedTask], policy_version: int
    ) -> tuple[list[RolloutGroup], RegisterWorkerResponse]:
        """Multi-turn tasks: every episode of every task played together (services/rollout/episodes.py)."""
        started_s = time.perf_counter()
        runner = self.episode_runner()
        episodes = runner.play([lease.task for lease in batch])
        generation_s = time.perf_counter() - started_s
        num_tokens = sum(sum(episode.mask) for group in episodes for episode in group)  # the model's tokens
        capacity_rows = self.max_groups_per_batch * batch[0].task.num_samples
        num_episodes = sum(len(group) for group in episodes)
        self.record_generation(num_episodes, generation_s, num_tokens, capacity_rows * runner.last_num_steps)
        registration = self.registration()
        built = [
            build_episode_group(lease.task, group, registration.worker_id, policy_version, generation_s)
            for lease, group in zip(batch, episodes, strict=True)
        ]
        return built, registration
