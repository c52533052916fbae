"""Held-out evaluation: greedy accuracy on the task's eval set (prompts never sampled for training).

The completions come from the rollout workers' engine (engines/torch_engine.py): the same prompt
encoding (shared.tokenization.encode_prompt), the same EOS set, the same decoded text, with a KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.episodes import run_episodes, start_episode
from engines.interface import InferenceEngine
from shared.tasks import TaskAdapter
from shared.tasks.environment import EnvironmentTask


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # fraction of held-out prompts whose greedy completion (or episode) scores exactly 1.0
    reward_mean: float  # mean verifier reward (partial credit included)
    num_prompts: int


def evaluate_greedy(engine: InferenceEngine, task: TaskAdapter, *, max_new_tokens: int) -> EvalResult:
    """Decode every held-out prompt greedily with `engine` (its loaded weights) and score it with the
    task's verifier; the text scored is the completion without its EOS, as the reward service sees it.
    A multi-turn task plays each held-out episode greedily to its end instead (engines/episodes.py), scored
    with the environment's return."""
    if isinstance(task, EnvironmentTask):
        return evaluate_greedy_episodes(engine, task, max_new_tokens=max_new_tokens)
    samples = engine.generate(
        [item.input for item in task.eval_set],
        num_samples=1,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        greedy=True,
    )
    rewards = [task.score(sample.text, item.reference) for item, (sample,) in zip(task.eval_set, samples, strict=True)]
    num_correct = sum(1 for reward in rewards if reward == 1.0)
    return EvalResult(num_correct / len(rewards), sum(rewards) / len(rewards), len(rewards))


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
