"""Held-out evaluation: greedy accuracy on the task's eval set (prompts never sampled for training).

The completions come from the rollout workers' engine (engines/torch_engine.py): the same prompt
encoding (shared.tokenization.encode_prompt), the same EOS set, the same decoded text, with a KV cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engines.episodes import run_episodes, start_episode
from engines.interface import InferenceEngine
from shared.tasks import TaskAdapter
from shared.tasks.environment import EnvironmentTask
from shared.verifier_pool import VerifierFailedError, VerifierPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # fraction of held-out prompts whose greedy completion (or episode) scores exactly 1.0
    reward_mean: float  # mean verifier reward (partial credit included)
    num_prompts: int
    num_verifier_failures: int = 0  # prompts the verifier timed out, raised or died on: counted as reward 0


def evaluate_greedy(
    engine: InferenceEngine, task: TaskAdapter, *, max_new_tokens: int, verifier: VerifierPool | None = None
) -> EvalResult:
    """Decode every held-out prompt greedily with `engine` (its loaded weights) and score it with the
    task's verifier; the text scored is the completion without its EOS, as the reward service sees it.

    With `verifier` (the learner), each completion is scored in the verifier's child process under its
    hard timeout, so a verifier that hangs on the model's output cannot wedge the evaluation: a prompt
    whose verifier times out (or raises, dies, or returns a reward outside [0, 1]) counts as wrong (reward
    0) and is counted in `num_verifier_failures`. Without it, `task.score` runs in the calling thread and
    its errors propagate (tests and benchmarks of the built-in tasks).

    A multi-turn task plays each held-out episode greedily to its end instead (engines/episodes.py), scored
    with the environment's return (computed in this process: the environment steps as the episode goes)."""
    if isinstance(task, EnvironmentTask):
        return evaluate_greedy_episodes(engine, task, max_new_tokens=max_new_tokens)
    samples = engine.generate(
        [item.input for item in task.eval_set],
        num_samples=1,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        greedy=True,
    )
    rewards, num_failures = [], 0
    for item, (sample,) in zip(task.eval_set, samples, strict=True):
        if verifier is None:
            rewards.append(task.score(sample.text, item.reference))
            continue
        try:
            (reward,) = verifier.score([sample.text], item.reference)
        except VerifierFailedError as exc:  # policy: the prompt counts as wrong (docstring)
            log.warning("held-out prompt scored 0: %s", exc)
            reward, num_failures = 0.0, num_failures + 1
        rewards.append(reward)
    num_correct = sum(1 for reward in rewards if reward == 1.0)
    return EvalResult(num_correct / len(rewards), sum(rewards) / len(rewards), len(rewards), num_failures)


def evaluate_greedy_episodes(engine: InferenceEngine, task: EnvironmentTask, *, max_new_tokens: int) -> EvalResult:
    """Every held-out episode played greedily, all in lockstep (one engine call per turn)."""
    episodes = [
        start_episode(engine, item.input, task.make_environment(item.reference), task.max_turns, max_new_tokens)
        for item in task.eval_set
    ]
    run_episodes(engine, episodes, max_new_tokens=max_new_tokens, temperature=1.0, greedy=True)
    rewards = [episode.reward for episode in episodes]
    num_correct = sum(1 for reward in rewards if reward == 1.0)
    return EvalResult(num_correct / len(rewards), sum(rewards) / len(rewards), len(rewards))
