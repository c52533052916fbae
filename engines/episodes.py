"""Multi-turn episodes driven by an inference engine (docs/environments.md).

Every episode's context is its token ids: the prompt, then its model turns and the environment's
observations interleaved. One turn of all active episodes is one engine call (`generate_from_ids`,
one sample per context), so the episodes of every group of a worker's batch step in lockstep; an
episode that ends drops out of the next call. An episode ends when the environment says done, at its
turn limit, or when the next turn would not fit the model's context; the last two are truncations
(`Environment.truncate()` gives their reward).

The completion an episode leaves is what the learner trains on, with its mask: model tokens (1; the
engine's behaviour log-probs) and observation tokens (0; log-prob 0.0, never trained). It always
starts and ends with a model turn: the observation after the last action is never appended.

A worker that batches continuously (services/rollout/continuous.py) plays the same episodes turn by turn
instead: each model turn is one row of its continuous batch (`next_turn`: the context so far as the row's
prompt), and `Episode.take_turn` appends it when the row finishes, exactly as `run_episodes` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engines.continuous import SampleRequest
from engines.interface import InferenceEngine, Sample, Sampling
from shared.messages import FinishReason
from shared.tasks.environment import Environment
from shared.tokenization import PromptInput


@dataclass
class Episode:
    """One sample of a multi-turn task, as it is played."""

    environment: Environment
    max_turns: int
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)  # completion: model and observation tokens
    mask: list[int] = field(default_factory=list)  # per completion token: 1 model, 0 environment
    logprobs: list[float] = field(default_factory=list)  # per completion token; 0.0 at observations
    actions: list[str] = field(default_factory=list)  # each model turn's decoded text (EOS excluded)
    text: str = ""  # the turns' texts and the observations, concatenated (what the reward service decodes)
    reward: float = 0.0  # the environment's return so far
    finish_reason: FinishReason = "length"  # of the last model turn
    done: bool = False
    truncated: bool = False

    @property
    def context(self) -> list[int]:
        return self.prompt_token_ids + self.token_ids

    @property
    def num_turns(self) -> int:
        return len(self.actions)

    def take_turn(self, sample: Sample, engine: InferenceEngine, max_new_tokens: int) -> None:
        """Append the model's turn, step the environment, then end the episode or append the observation."""
        self.token_ids += sample.token_ids
        self.mask += [1] * sample.num_tokens
        self.logprobs += sample.logprobs
        self.actions.append(sample.text)
        self.text += sample.text
        self.finish_reason = sample.finish_reason
        result = self.environment.step(sample.text)
        self.reward += result.reward
        if result.done:
            self.done = True
            return
        if not result.observation:
            # without environment tokens between them, two turns would read as one (the mask splits turns)
            raise ValueError(f"{type(self.environment).__name__} went on without an observation")
        observation_ids = engine.encode_observation(result.observation)
        fits = engine.max_positions is None or (
            len(self.context) + len(observation_ids) + max_new_tokens <= engine.max_positions
        )
        if self.num_turns >= self.max_turns or not fits:
            self.reward += self.environment.truncate()
            self.done = self.truncated = True
            return
        self.token_ids += observation_ids
        self.mask += [0] * len(observation_ids)
        self.logprobs += [0.0] * len(observation_ids)
        self.text += result.observation


def start_episode(
    engine: InferenceEngine, prompt: PromptInput, environment: Environment, max_turns: int, max_new_tokens: int
) -> Episode:
    """Reset `environment` (its first observation must be the prompt's text) and encode the prompt."""
    observation = environment.reset()
    if observation != prompt.text:
        raise ValueError(
            f"{type(environment).__name__}.reset() gave {observation[:60]!r}, not the task's prompt {prompt.text[:60]!r}"
        )
    (prompt_ids,) = engine.encode_prompts([prompt], max_new_tokens)
    return Episode(environment, max_turns, prompt_ids)


def run_episodes(
    engine: InferenceEngine,
    episodes: Sequence[Episode],
    sampling: Sampling,
    sampling_seeds: Sequence[int] | None = None,
) -> int:
    """Play every episode to its end, one engine call per turn for all that are still going. Returns the
    decoding steps the calls took (each call's longest turn), for the worker's batch occupancy. `sampling`:
    each turn's, one sample of its context (num_samples 1, else ValueError).

    `sampling_seeds` (one per episode; None, the workers' choice: the engine's own random sampling): keyed
    sampling, every turn of episode i drawn with seed sampling_seeds[i], its positions counted from the turn's
    first token (as a continuous batch's row counts them). The learner does not check episodes' keyed sampling
    (services/learner/provenance.py), so workers do not key them; tests do, to compare the two ways of playing."""
    if sampling.num_samples != 1:
        raise ValueError(f"an episode's turn is one sample of its context, not {sampling.num_samples}")
    if sampling_seeds is not None and len(sampling_seeds) != len(episodes):
        raise ValueError(f"{len(sampling_seeds)} sampling seeds for {len(episodes)} episodes")
    active = [index for index, episode in enumerate(episodes) if not episode.done]
    num_steps = 0
    while active:
        samples = engine.generate_from_ids(
            [episodes[index].context for index in active],
            sampling,
            None if sampling_seeds is None else [sampling_seeds[index] for index in active],
        )
        num_steps += max(sample.num_tokens for (sample,) in samples)
        for index, (sample,) in zip(active, samples, strict=True):
            episodes[index].take_turn(sample, engine, sampling.max_new_tokens)
        active = [index for index in active if not episodes[index].done]
    return num_steps


def next_turn(episode: Episode, request_id: int, sampling: Sampling, seed: int | None = None) -> SampleRequest:
    """The episode's next model turn as one row of a continuous batch: the context so far (the prompt, the
    model's turns and the observations) is the row's prompt, as `run_episodes` gives it to the engine.
    `sampling`: the turn's (one sample)."""
    if episode.done:
        raise ValueError("the episode has ended: it has no next turn")
    return SampleRequest(request_id, tuple(episode.context), sampling, seed)
