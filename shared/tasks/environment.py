"""Multi-turn environments: the interface a rollout worker drives, and the replay a reward service scores.

An episode (docs/environments.md):

    observation = env.reset()                   # the task's prompt
    for turn in range(max_turns):
        action = <the model's turn, decoded>    # max_new_tokens per turn
        result = env.step(action)               # observation, reward, done
        if result.done: break
    else: return += env.truncate()              # cut at the turn limit (or the context filled up)

The episode's return is the sum of its step rewards (plus `truncate()` when it was cut) and must lie
in [0, 1], the reward range the learner expects. An environment is deterministic given the state it
was built from and the actions it was given: that is what lets the reward service replay a worker's
episode from the token ids it trains on (`replay`) instead of trusting the worker's reward.

A single-turn task is the one-step case: `SingleTurnEnvironment` shows the prompt and scores the one
action with the task's verifier. The worker keeps its one-call path for single-turn tasks (one engine
call samples every group); the equivalence is pinned by tests/unit/test_environments.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.tasks.base import ChanceBaseline, TaskAdapter


@dataclass(frozen=True)
class StepResult:
    observation: str  # shown to the model before its next turn (ignored when done)
    reward: float  # added to the episode's return
    done: bool


class Environment(ABC):
    """One episode. Built from a task's state string; not reused across episodes."""

    @abstractmethod
    def reset(self) -> str:
        """Start the episode; returns the first observation (the prompt of the task)."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply the model's turn (its decoded text, EOS excluded). Any text is a valid input: an
        environment maps what it cannot parse to a documented default action, it never raises."""

    def truncate(self) -> float:
        """The reward of ending the episode here, before it is done (turn limit reached, context full);
        added to the return. Default: nothing more."""
        return 0.0


class SingleTurnEnvironment(Environment):
    """The one-step environment of a single-turn task: the prompt, then the verifier's score of one action."""

    def __init__(self, prompt: str, reference: str, score: Callable[[str, str], float]) -> None:
        self.prompt, self.reference, self.score = prompt, reference, score

    def reset(self) -> str:
        return self.prompt

    def step(self, action: str) -> StepResult:
        return StepResult(observation="", reward=self.score(action, self.reference), done=True)


@dataclass(frozen=True)
class Replay:
    """What the reward service recomputes from a sample's actions."""

    reward: float  # the episode's return
    observations: list[str]  # the observation after each action but the last (the environment's tokens)


class EnvironmentTask(TaskAdapter):
    """A task whose samples are multi-turn episodes. Its prompts' `reference` is the environment's state
    (e.g. a seed): it is sent to the workers (TaskGroup.environment) and holds no secret, because the
    reward is recomputed by replaying the episode, never read from the worker."""

    max_turns: int  # model turns per episode at most (the worker's turn limit)

    @abstractmethod
    def make_environment(self, state: str) -> Environment:
        """A fresh episode for `state` (a prompt's reference); deterministic given the state and the actions."""

    def in_answer_form(self, completion: str) -> bool | None:
        """None: an episode's actions are parsed leniently, so it has no form apart from its return."""
        return None

    def chance_baseline(self) -> ChanceBaseline | None:
        return None

    def replay(self, state: str, actions: Sequence[str]) -> Replay:
        """Play `actions` in a fresh environment: the reward service's own reward for a worker's episode."""
        return replay(self.make_environment(state), actions, self.max_turns)

    def score(self, completion: str, reference: str) -> float:
        """The one-action view (held-out evaluation, which decodes one turn): the episode with `completion`
        as the first action, cut there if it goes on."""
        return self.replay(reference, [completion]).reward


def replay(environment: Environment, actions: Sequence[str], max_turns: int) -> Replay:
    """Reset, step through `actions`, truncate if not done. Raises ValueError if there are more actions
    than turns or the episode ended before the last action (no honest worker sends those)."""
    if not 1 <= len(actions) <= max_turns:
        raise ValueError(f"{len(actions)} actions for an episode of 1 to {max_turns} turns")
    environment.reset()
    total, observations = 0.0, list[str]()
    for turn, action in enumerate(actions):
        result = environment.step(action)
        total += result.reward
        if result.done:
            if turn != len(actions) - 1:
                raise ValueError(f"the episode ended after action {turn + 1} of {len(actions)}")
            return Replay(total, observations)
        if turn != len(actions) - 1:
            observations.append(result.observation)
    return Replay(total + environment.truncate(), observations)


def single_turn_environment(task: TaskAdapter, prompt: str, reference: str) -> SingleTurnEnvironment:
    """A single-turn task's prompt as the one-step case of the environment interface."""
    return SingleTurnEnvironment(prompt, reference, task.score)
