"""The tasks of a continuous worker's batch (services/rollout/continuous.py) and the rows they put in it.

A single-turn task (`SamplesInFlight`) is one row per sample, all queued when it is admitted; its group is
built when its last row finishes.

A multi-turn task (`EpisodesInFlight`: an environment, docs/environments.md) is played turn by turn. Each
episode has at most one row in the batch: its next model turn, whose prompt is the episode's context so far
(engines/episodes.py `next_turn`). When the row finishes, the turn is appended and the environment steps
(`Episode.take_turn`, as batch mode's `run_episodes` does); an episode that goes on queues its next turn,
which waits for a place like any row. Other tasks' rows decode meanwhile: an episode holds no place while
its environment steps or its next turn waits. When every episode has ended, the task's group is the one
batch mode builds (services/rollout/episodes.py `build_episode_group`), with the versions below.

Versions: a row records the version that sampled each of its tokens (engines/continuous.py). A turn's
change points are moved into its episode's completion (the turn's offset + token index), so the group's
`version_changes` index the completion the learner reads. Observation tokens sit in that completion too;
they take the version of the token before them and are never trained (services/learner/batch.py). A turn
admitted after a load starts on the new version; a turn in flight at a load records the token where the new
version took over. `policy_version` is the oldest version of any model token.

Turns are not keyed (seed None), like batch mode's episodes: the learner checks keyed sampling for
single-turn groups only (services/learner/provenance.py: a turn's positions restart at 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engines.continuous import ContinuousBatch, FinishedSample, SampleRequest, VersionChange
from engines.episodes import Episode, next_turn
from engines.interface import EngineError, InferenceEngine, Sampling
from services.rollout.episodes import EpisodeRunner, build_episode_group
from services.rollout.rollout_groups import build_rollout_group
from shared.keyed_sampling import task_seed
from shared.messages import RolloutGroup, pack_int32
from shared.tokenization import PromptInput
from shared.work_api import LeasedTask

REQUESTS_PER_TASK = 1 << 16  # a request id is task number * this + sample index


def request_id(task_number: int, sample_index: int) -> int:
    return task_number * REQUESTS_PER_TASK + sample_index


@dataclass
class SamplesInFlight:
    """A single-turn task: every sample is one row."""

    lease: LeasedTask
    number: int  # its task number in the batch's request ids
    admitted_at_s: float
    samples: dict[int, FinishedSample] = field(default_factory=dict)  # by sample index, as they finish

    def first_rows(self, engine: InferenceEngine) -> list[SampleRequest]:
        """Every sample's row, keyed with the task's seeds (raises EngineError for a prompt the engine cannot
        serve)."""
        task = self.lease.task
        (prompt_ids,) = engine.encode_prompts([PromptInput.of_task(task)], task.max_new_tokens)
        seed = task_seed(task.task_id)
        row = Sampling.of_task(task).one_sample()
        return [
            SampleRequest(request_id(self.number, j), tuple(prompt_ids), row, seed + j) for j in range(task.num_samples)
        ]

    def take(self, index: int, finished: FinishedSample) -> SampleRequest | None:
        """Sample `index` finished: nothing follows it."""
        self.samples[index] = finished
        return None

    @property
    def done(self) -> bool:
        return len(self.samples) == self.lease.task.num_samples

    def group(self, worker_id: str) -> RolloutGroup:
        samples = [self.samples[j] for j in range(self.lease.task.num_samples)]
        oldest, changes = version_changes([list(sample.versions) for sample in samples])
        return build_rollout_group(
            self.lease.task,
            [sample.sample for sample in samples],
            worker_id,
            oldest,
            time.perf_counter() - self.admitted_at_s,
            version_changes=changes,
        )


@dataclass
class EpisodesInFlight:
    """A multi-turn task: its episodes, each with its next turn as a row until it ends."""

    lease: LeasedTask
    number: int
    admitted_at_s: float
    episodes: list[Episode]  # episode j is sample j
    engine: InferenceEngine  # encodes the observations
    # per episode: from which completion token on (model and observation tokens) which version sampled
    versions: list[list[VersionChange]] = field(default_factory=list)
    seed: int | None = None  # keyed sampling of episode j's turns with seed + j; None (the worker's): random

    def first_rows(self) -> list[SampleRequest]:
        return [self.turn(j) for j, episode in enumerate(self.episodes) if not episode.done]

    def turn(self, index: int) -> SampleRequest:
        seed = None if self.seed is None else self.seed + index
        turn = Sampling.of_task(self.lease.task).one_sample()
        return next_turn(self.episodes[index], request_id(self.number, index), turn, seed)

    def take(self, index: int, finished: FinishedSample) -> SampleRequest | None:
        """Episode `index`'s turn finished: append it, step the environment; its next turn if it goes on.
        Raises EngineError for an observation the engine cannot encode."""
        episode = self.episodes[index]
        offset = len(episode.token_ids)  # the turn's first token in the episode's completion
        for change in finished.versions:
            follow(self.versions[index], offset + change.token_index, change.policy_version)
        episode.take_turn(finished.sample, self.engine, self.lease.task.max_new_tokens)
        return None if episode.done else self.turn(index)

    @property
    def done(self) -> bool:
        return all(episode.done for episode in self.episodes)

    def group(self, worker_id: str) -> RolloutGroup:
        oldest, changes = version_changes(self.versions)
        return build_episode_group(
            self.lease.task,
            self.episodes,
            worker_id,
            oldest,
            time.perf_counter() - self.admitted_at_s,
            version_changes=changes,
        )


TaskInFlight = SamplesInFlight | EpisodesInFlight


def follow(versions: list[VersionChange], token_index: int, policy_version: int) -> None:
    """From `token_index` on, `policy_version` sampled: a change point unless it is already the version."""
    if not versions or versions[-1].policy_version != policy_version:
        versions.append(VersionChange(token_index, policy_version))


def version_changes(versions: Sequence[Sequence[VersionChange]]) -> tuple[int, bytes]:
    """The samples' change points (each starting at token 0) as a group's policy_version, the oldest, and its
    version_changes: int32 (sample, token, version) triples of every later version, sorted."""
    oldest = min(change.policy_version for changes in versions for change in changes)
    triples = [
        (index, change.token_index, change.policy_version)
        for index, changes in enumerate(versions)
        for change in changes
        if change.policy_version > oldest
    ]
    return oldest, pack_int32([value for triple in triples for value in triple])


@dataclass
class Stepped:
    """What one step of the batch completed."""

    completed: list[TaskInFlight]  # every sample finished: ready to become groups
    failed: list[tuple[LeasedTask, EngineError]]  # tasks dropped because the engine could not serve them
    num_samples_done: int  # single-turn samples and episodes that ended this step
    num_rows: int  # rows decoded (one token each)


class ContinuousTasks:
    """The tasks whose rows are in one continuous batch, by task number."""

    def __init__(self, engine: InferenceEngine, max_rows: int, episode_runner: Callable[[], EpisodeRunner]) -> None:
        self.engine = engine
        self.batch: ContinuousBatch = engine.continuous_batch(max_rows)
        self.episode_runner = episode_runner  # built on the first multi-turn task (the run's task adapter)
        self.in_flight: dict[int, TaskInFlight] = {}
        self._next_task = 0

    @property
    def room(self) -> int:
        """Rows the batch could take now without anything waiting."""
        return self.batch.max_rows - self.batch.num_running - self.batch.num_waiting

    def admit(self, lease: LeasedTask, episode_seed: int | None = None) -> TaskInFlight:
        """Queue the task's first rows: every sample, or every episode's first turn. Raises EngineError for a
        task the engine cannot serve (nothing queued). `episode_seed`: EpisodesInFlight.seed."""
        number = self._next_task
        self._next_task += 1
        task: TaskInFlight
        if lease.task.environment is None:
            task = SamplesInFlight(lease, number, time.perf_counter())
            rows = task.first_rows(self.engine)
        else:
            episodes = self.episode_runner().start(lease.task)
            versions: list[list[VersionChange]] = [[] for _ in episodes]
            task = EpisodesInFlight(lease, number, time.perf_counter(), episodes, self.engine, versions, episode_seed)
            rows = task.first_rows()
        self.batch.add(rows)
        self.in_flight[number] = task
        return task

    def step(self) -> Stepped:
        """One decoding step; a finished turn whose episode goes on queues the next turn at once. An
        EngineError while taking a task's row fails that task alone: its other rows are dropped."""
        finished = self.batch.step()
        stats = self.batch.last_step
        touched: set[int] = set()
        failed: dict[int, EngineError] = {}
        num_samples_done = 0
        for sample in finished:
            number, index = divmod(sample.request_id, REQUESTS_PER_TASK)
            if number in failed:
                continue
            try:
                next_row = self.in_flight[number].take(index, sample)
                if next_row is not None:
                    self.batch.add([next_row])
            except EngineError as exc:  # e.g. an observation the tokenizer cannot represent
                failed[number] = exc
                continue
            num_samples_done += next_row is None
            touched.add(number)
        dropped = [self.drop(number) for number in failed]
        completed = [self.in_flight.pop(n) for n in sorted(touched - failed.keys()) if self.in_flight[n].done]
        return Stepped(
            completed,
            [(task.lease, failed[task.number]) for task in dropped],
            num_samples_done,
            stats.num_rows if stats is not None else 0,
        )

    def drop(self, number: int) -> TaskInFlight:
        """Take the task out: its rows, running or waiting, leave the batch."""
        task = self.in_flight.pop(number)
        self.batch.abort([request_id(number, j) for j in range(task.lease.task.num_samples)])
        return task
