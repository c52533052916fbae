"""Held-out evaluation: greedy accuracy on the task's eval set (prompts never sampled for training).

The completions come from the rollout workers' engine (engines/torch_engine.py): the same prompt
encoding (shared.tokenization.encode_prompt), the same EOS set, the same decoded text, with a KV cache.

Accuracy alone cannot tell a format gain from a skill gain (docs/evaluation.md), so every result also says
how many answers were in the form the task asks for (TaskAdapter.in_answer_form), how accurate those were,
and the task's chance baseline: what the form alone scores (TaskAdapter.chance_baseline).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from engines.episodes import run_episodes, start_episode
from engines.interface import InferenceEngine, Sampling
from shared.run_records import EvalRecord
from shared.tasks import TaskAdapter
from shared.tasks.base import ChanceBaseline
from shared.tasks.environment import EnvironmentTask
from shared.verifier_pool import VerifierFailedError, VerifierPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # fraction of held-out prompts whose greedy completion (or episode) scores exactly 1.0
    reward_mean: float  # mean verifier reward (partial credit included)
    num_prompts: int
    num_verifier_failures: int = 0  # prompts the verifier timed out, raised or died on: counted as reward 0
    format_rate: float | None = None  # share of answers in the task's answer form (None: the task has no form)
    formatted_accuracy: float | None = None  # accuracy among those (None: no answer in form, or no form)

    def record(
        self, task: TaskAdapter, *, eval_step: int, eval_s: float, eval_stall_s: float, wall_s: float, evaluated_by: str
    ) -> EvalRecord:
        """The metrics line of this evaluation of version `eval_step`, the task's chance baseline beside it."""
        chance = chance_baseline(task)
        return EvalRecord(
            eval_step=eval_step,
            eval_accuracy=self.accuracy,
            eval_reward_mean=self.reward_mean,
            num_eval_prompts=self.num_prompts,
            num_verifier_failures=self.num_verifier_failures,
            eval_format_rate=self.format_rate,
            eval_formatted_accuracy=self.formatted_accuracy,
            eval_chance_accuracy=chance.accuracy if chance is not None else None,
            eval_chance_strategy=chance.strategy if chance is not None else None,
            eval_s=eval_s,
            eval_stall_s=eval_stall_s,
            wall_s=wall_s,
            evaluated_by=evaluated_by,
        )


def summarize_eval(
    task: TaskAdapter, completions: Sequence[str], rewards: Sequence[float], num_verifier_failures: int = 0
) -> EvalResult:
    """The result of one evaluation from its greedy completions and their rewards (held-out order or any:
    each completion beside its own reward). A completion is right when its reward is exactly 1.0."""
    if len(completions) != len(rewards) or not rewards:
        raise ValueError(f"{len(completions)} completions for {len(rewards)} rewards: one each, at least one")
    correct = [reward == 1.0 for reward in rewards]
    forms = [task.in_answer_form(completion) for completion in completions]
    format_rate = formatted_accuracy = None
    if all(form is not None for form in forms):
        in_form = [right for right, form in zip(correct, forms, strict=True) if form]
        format_rate = len(in_form) / len(forms)
        formatted_accuracy = sum(in_form) / len(in_form) if in_form else None
    return EvalResult(
        accuracy=sum(correct) / len(rewards),
        reward_mean=sum(rewards) / len(rewards),
        num_prompts=len(rewards),
        num_verifier_failures=num_verifier_failures,
        format_rate=format_rate,
        formatted_accuracy=formatted_accuracy,
    )


def describe_eval(record: EvalRecord) -> str:
    """One line: accuracy, then what it is made of ("accuracy 0.425 on 200 held-out prompts; 100% in the
    answer form, 0.427 of those right; chance 0.020 (the majority answer, always)")."""
    text = f"accuracy {record.eval_accuracy:.3f} on {record.num_eval_prompts} held-out prompts"
    if record.eval_format_rate is not None:
        text += f"; {record.eval_format_rate:.0%} in the answer form"
        if record.eval_formatted_accuracy is not None:
            text += f", {record.eval_formatted_accuracy:.3f} of those right"
    if record.eval_chance_accuracy is not None:
        text += f"; chance {record.eval_chance_accuracy:.3f} ({record.eval_chance_strategy})"
    return text


@functools.cache
def chance_baseline(task: TaskAdapter) -> ChanceBaseline | None:
    """The task's chance baseline, computed once per adapter (a math task's runs its verifier per candidate)."""
    return task.chance_baseline()


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
        [item.input for item in task.eval_set], Sampling(1, max_new_tokens, temperature=1.0, greedy=True)
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
    return summarize_eval(task, [sample.text for (sample,) in samples], rewards, num_failures)


def evaluate_greedy_episodes(engine: InferenceEngine, task: EnvironmentTask, *, max_new_tokens: int) -> EvalResult:
    """Every held-out episode played greedily, all in lockstep (one engine call per turn)."""
    episodes = [
        start_episode(engine, item.input, task.make_environment(item.reference), task.max_turns, max_new_tokens)
        for item in task.eval_set
    ]
    run_episodes(engine, episodes, Sampling(1, max_new_tokens, temperature=1.0, greedy=True))
    rewards = [episode.reward for episode in episodes]
    return summarize_eval(task, ["" for _ in episodes], rewards)  # an episode has no answer form
