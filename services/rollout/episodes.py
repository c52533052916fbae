"""The worker's multi-turn path: TaskGroups with an `environment` -> episodes -> masked RolloutGroups.

Each task's group is `num_samples` episodes of the same state (one GRPO group: same deal, different
play). Batch mode: all episodes of all tasks in the batch are played together by engines/episodes.py (one
engine call per turn). Continuous mode plays each task's episodes turn by turn as rows of its batch
(services/rollout/continuous_tasks.py), from the same `EpisodeRunner.start` and into the same
`build_episode_group`. The wire format is RolloutGroup's masked form (shared/messages.py): each sample's
completion interleaves its model turns and the observations, `completion_mask` says whose each token
is, `env_rewards` carries the worker's episode returns (the reward service replays and ignores them).
"""

from __future__ import annotations

from engines.episodes import Episode, run_episodes, start_episode
from engines.interface import InferenceEngine, Sampling
from services.rollout.rollout_groups import build_rollout_group
from shared.config import TaskConfig
from shared.messages import RolloutGroup, TaskGroup, pack_mask
from shared.tasks import build_task
from shared.tasks.environment import EnvironmentTask
from shared.tokenization import PromptInput


class EpisodeRunner:
    """Builds each task's environments from the run's task adapter and plays them with the engine."""

    def __init__(self, engine: InferenceEngine, task_config: TaskConfig) -> None:
        task = build_task(task_config)
        if not isinstance(task, EnvironmentTask):
            raise ValueError(f"task {task_config.name!r} is not an EnvironmentTask: it has no episodes to play")
        self.engine = engine
        self.task = task
        self.last_num_steps = 0  # decoding steps of the last `play`

    def start(self, task: TaskGroup) -> list[Episode]:
        """The task's `num_samples` episodes, reset and with their prompt encoded (raises EngineError for a
        prompt the engine cannot serve)."""
        if task.environment is None:
            raise ValueError(f"task {task.task_id} has no environment")
        state, max_turns = task.environment.state, task.environment.max_turns
        prompt = PromptInput.of_task(task)
        return [
            start_episode(self.engine, prompt, self.task.make_environment(state), max_turns, task.max_new_tokens)
            for _ in range(task.num_samples)
        ]

    def play(self, tasks: list[TaskGroup]) -> list[list[Episode]]:
        """result[i][j] is episode j of tasks[i]; every task must share max_new_tokens and temperature (each
        episode's turns are sampled with the first task's). The decoding steps the engine took are left in
        `last_num_steps`."""
        groups = [self.start(task) for task in tasks]
        first = tasks[0]
        self.last_num_steps = run_episodes(
            self.engine, [episode for group in groups for episode in group], Sampling.of_task(first).one_sample()
        )
        return groups


def build_episode_group(
    task: TaskGroup,
    episodes: list[Episode],
    worker_id: str,
    policy_version: int,
    generation_s: float,
    version_changes: bytes = b"",
) -> RolloutGroup:
    """The wire form of one task's episodes (masked: model and observation tokens interleaved).
    `version_changes`: a continuous worker's (RolloutGroup), in the completions' token index space."""
    return build_rollout_group(
        task,
        episodes,
        worker_id,
        policy_version,
        generation_s,
        completion_mask=pack_mask([flag for episode in episodes for flag in episode.mask]),
        # informational (the reward service replays); clamped so a task's bad return cannot make the group invalid
        env_rewards=[min(1.0, max(0.0, episode.reward)) for episode in episodes],
        version_changes=version_changes,
    )
