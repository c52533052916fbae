"""The inference-engine seam: what a rollout worker (and the learner's evaluation) needs from whatever
samples completions.

`TorchEngine` (engines/torch_engine.py, transformers) and `VLLMEngine` (engines/vllm_engine.py)
implement it; workers get one from engines.select.build_engine and never import either directly. The
learner's evaluator (services/learner/evaluator.py) builds a TorchEngine itself: vLLM never runs in the
learner's process.
This module imports neither torch nor vllm.

How to sample is one argument, `Sampling` (vLLM's frozen SamplingParams is the model): every engine call, the
episode runner and a continuous batch's rows take it, checked once when it is built.

Behaviour logprobs are defined exactly as the learner recomputes them: the log-softmax of
`logits / temperature` at the sampled token (also for greedy decoding), so the importance ratio of
a fresh on-policy sample is 1.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from shared.messages import FinishReason, TaskGroup
from shared.tokenization import PromptInput
from shared.weight_channel import Buffer, LoraAdapter, WeightsLoadError

if TYPE_CHECKING:
    from engines.continuous import ContinuousBatch


class EngineError(RuntimeError):
    """Base of what an engine raises for one request it cannot serve (the worker dead-letters it)."""


class UnencodablePromptError(EngineError, ValueError):
    """The tokenizer cannot represent the prompt (a character outside its vocabulary), or its chat
    template fails to render the prompt's messages."""


class PromptTooLongError(EngineError, ValueError):
    """Prompt plus completion would not fit in the model's context."""


@dataclass(frozen=True)
class Sampling:
    """How the completions of a call are sampled, the same for each of its prompts; raises ValueError unless
    num_samples >= 1, max_new_tokens >= 1 and temperature > 0.

    Keyed sampling's seeds are not part of it: they are one per prompt (sample j of prompt i drawn with seed
    sampling_seeds[i] + j), derived from each task's id, so they change with the prompts a call batches, while
    one Sampling serves every call of a kind of task (the worker batches the tasks that share one). They go
    beside the prompts: `sampling_seeds` of `generate`, `SampleRequest.seed` of a continuous batch's row."""

    num_samples: int  # completions per prompt
    max_new_tokens: int  # completion length cap, EOS included
    temperature: float  # softmax(logits / temperature): what is sampled, and the behaviour log-probs
    greedy: bool = False  # argmax at every step (evaluation); log-probs still use `temperature`

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.max_new_tokens < 1 or self.temperature <= 0:
            raise ValueError(
                "need num_samples >= 1, max_new_tokens >= 1, temperature > 0; "
                f"got {self.num_samples}, {self.max_new_tokens}, {self.temperature}"
            )

    @classmethod
    def of_task(cls, task: TaskGroup) -> Sampling:
        """The task's group: its num_samples completions, each up to max_new_tokens, at its temperature."""
        return cls(task.num_samples, task.max_new_tokens, task.temperature)

    def one_sample(self) -> Sampling:
        """The same, for one sample: an episode's turn, a continuous batch's row."""
        return replace(self, num_samples=1)


@dataclass(frozen=True)
class Sample:
    """One completion of one prompt."""

    prompt_token_ids: list[int]
    token_ids: list[int]  # completion tokens, EOS included when sampled
    logprobs: list[float]  # one per completion token: log p(token) under softmax(logits / temperature)
    text: str  # decoded completion, EOS excluded
    finish_reason: FinishReason  # "stop": ended with EOS; "length": hit max_new_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class InferenceEngine(ABC):
    """Samples completions with the weights of one announced policy version at a time."""

    # shared.tokenization.model_fingerprint of the engine's model folder: the worker refuses weights
    # published for another fingerprint. Empty: unknown, not checked (test stand-ins).
    model_fingerprint: str = ""
    _policy_version: int = -1  # set by load_weights once the weights are in
    # The model's context in tokens (prompt + completion); None: not known. Episodes stop before it.
    max_positions: int | None = None
    # A folder where this engine wants received weights written as files (vLLM loads checkpoints by path):
    # the worker's chunk store writes each full version there chunk by chunk as it arrives. None: memory.
    weights_dir: Path | None = None
    # The folder the engine loaded: the base a LoRA adapter applies to (shared.weight_channel.lora.base_fingerprint of it).
    model_dir: Path | None = None

    @property
    def policy_version(self) -> int:
        """The version of the weights loaded with `load_weights`; -1 before any load."""
        return self._policy_version

    def generate(
        self,
        prompts: Sequence[str | PromptInput],
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        """`sampling.num_samples` completions of each prompt: result[i][j] is sample j of prompts[i].

        `sampling_seeds` (one per prompt): keyed sampling (shared/keyed_sampling.py), sample j of prompt i
        drawn with seed sampling_seeds[i] + j, so anyone with the weights can check how each token was
        chosen. None: the engine's own random sampling.

        A prompt is encoded by shared.tokenization.encode_prompt (the learner's evaluation uses the
        same rule): chat messages go through the tokenizer's chat template when it has one.

        `sampling.greedy` takes the argmax at every step (evaluation); logprobs still use its temperature.
        Raises an EngineError subclass when a prompt cannot be served (the whole call fails: callers
        isolate a bad prompt by retrying one prompt per call). Every engine: encode_prompts, then
        generate_from_ids."""
        if not prompts:
            return []
        return self.generate_from_ids(self.encode_prompts(prompts, sampling.max_new_tokens), sampling, sampling_seeds)

    @abstractmethod
    def generate_from_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        """`generate` from prompts already encoded: a multi-turn episode continues its context (the prompt,
        the model's turns and the environment's observations, as ids) without re-encoding text.
        Raises PromptTooLongError if a context + max_new_tokens exceeds the model's positions."""

    @abstractmethod
    def encode_prompts(self, prompts: Sequence[str | PromptInput], max_new_tokens: int = 0) -> list[list[int]]:
        """Token ids of each prompt as `generate` encodes them (engines/prompts.py), checked."""

    @abstractmethod
    def encode_observation(self, text: str) -> list[int]:
        """The ids an environment's observation appends to a context (shared.tokenization.encode_observation:
        no special tokens). Raises UnencodablePromptError for text the tokenizer cannot represent."""

    @abstractmethod
    def load_weights(self, safetensors_bytes: Buffer, policy_version: int, path: Path | None = None) -> None:
        """Swap in the weights of `policy_version` (a safetensors blob of the model's state dict, any
        buffer: bytes or a view of the receiver's buffer, read without a copy; a model with tied
        embeddings may leave out `lm_head.weight`). `path`, when given, is a file holding the same
        bytes, for an engine that loads checkpoints from disk (vLLM). Raises WeightsLoadError and keeps
        the old weights and version if the blob does not fit the model."""

    def continuous_batch(self, max_rows: int) -> ContinuousBatch:
        """A running batch on this engine that admits rows as others finish and follows weight changes
        between decoding steps (engines/continuous.py). Raises NotImplementedError where the engine has none."""
        raise NotImplementedError(f"{type(self).__name__} has no continuous batching")

    def load_adapter(self, adapter_bytes: Buffer, adapter: LoraAdapter, policy_version: int) -> None:
        """Swap in `policy_version` of a LoRA run: the base this engine loaded with the adapter applied
        (W_base + (alpha / r) B A on every target; each version onto the base, never onto the previous
        one). `adapter_bytes`: peft's adapter_model.safetensors layout (shared/weight_channel/lora.py). Raises
        WeightsLoadError and keeps the old weights and version if the adapter does not fit the model."""
        raise WeightsLoadError(f"{type(self).__name__} cannot apply LoRA adapters")
