"""What one honest RolloutGroup can hold, and the decode limits that follow (shared/bounded_msgpack.py).

A worker's answer is decoded within the limits of the task it answers. The reward service issues each
TaskGroup from the run file (services/reward/task_feed.py: `num_samples` is [grpo] group_size,
`max_new_tokens` [grpo] max_new_tokens, an environment's `max_turns` its task adapter's), so an honest
group of the run holds at most:

    samples        num_samples: completion_texts, finish_reasons and env_rewards have one entry each
    model tokens   per sample: max_new_tokens; a multi-turn episode's: max_turns x max_new_tokens
    all tokens     per sample: the model's; a multi-turn episode adds the environment's observations, which
                   the run does not bound (the group's MAX_GROUP_BYTES does)
    text           per sample: MAX_TEXT_BYTES_PER_TOKEN per completion token; the prompt is the task's own
    nesting        a map of scalars and of lists of scalars (depth 2): its fields plus 3 lists of num_samples

A lease whose task cannot be read is answered within what any TaskGroup allows (its answer is refused then
anyway). The run alone bounds a whole group's bytes only where it sizes the model: with `init =
"tiny-random"` every token of a sample, prompt and all turns, fits `max_position_embeddings` and the
character tokenizer writes a few bytes per token; `largest_group_bytes` gives that group, from which the
work API's body limit follows (shared/work_api.py max_submission_bytes). Every other run can produce a group
of up to MAX_GROUP_BYTES.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Self

import annotated_types
import numpy as np
from pydantic import BaseModel

from shared.bounded_msgpack import DecodeLimits
from shared.config import RunConfig
from shared.messages import EnvironmentSpec, RolloutGroup, TaskGroup, unpack_int32, unpack_mask
from shared.model_catalog import TINY_RANDOM

# One encoded RolloutGroup: 64 samples x 4,096 tokens x 8 bytes (id + log-prob) is 2 MiB, plus texts.
MAX_GROUP_BYTES = 4 * 1024 * 1024
# A completion's text, UTF-8, per completion token. Generous: the longest tokens of common vocabularies are
# far shorter, and a byte that is no character alone decodes to U+FFFD (3 bytes).
MAX_TEXT_BYTES_PER_TOKEN = 1024
# tiny-random's character tokenizer (services/learner/model_init.py): a character (<= 4 bytes) or one of
# "<pad>", "<eos>", "<bos>" per token
TINY_RANDOM_TEXT_BYTES_PER_TOKEN = 8
MAX_ID_STR_BYTES = 4 * 128  # run_id, group_id, task_name, ...: at most 128 characters of <= 4 bytes
# bytes per completion token: its id and behaviour log-prob (int32, float32), its mask byte, and a version
# change (three int32) in the worst case, one per token
COMPLETION_BYTES_PER_TOKEN = 4 + 4 + 1 + 12
SAMPLE_OVERHEAD_BYTES = 32  # its length, finish reason, env reward and the headers of their entries
GROUP_OVERHEAD_BYTES = 2048  # field names, ids, floats, the mac, headers

_GROUP_FIELDS = RolloutGroup.model_fields
NUM_GROUP_FIELDS = len(_GROUP_FIELDS)
NUM_PER_SAMPLE_LISTS = sum(typing.get_origin(field.annotation) is list for field in _GROUP_FIELDS.values())


@dataclass(frozen=True)
class RolloutLimits:
    """The most an honest answer to one task holds. `max_model_tokens_per_sample`: the tokens the model
    sampled in one sample (all its turns); `multi_turn`: the task's samples are episodes, whose environment
    tokens come on top. `prompt_bytes`: the task's prompt, UTF-8 (the group repeats it)."""

    num_samples: int
    max_model_tokens_per_sample: int
    multi_turn: bool
    prompt_bytes: int

    @classmethod
    def for_task(cls, task: TaskGroup) -> Self:
        turns = task.environment.max_turns if task.environment is not None else 1
        prompt_bytes = len(task.prompt.encode())
        return cls(task.num_samples, turns * task.max_new_tokens, task.environment is not None, prompt_bytes)

    @classmethod
    def any_task(cls) -> Self:
        """Within what any TaskGroup allows (its schema's maxima): for a lease whose task cannot be read."""
        max_turns = _schema_max(EnvironmentSpec, "max_turns")
        max_tokens = max_turns * _schema_max(TaskGroup, "max_new_tokens")
        return cls(_schema_max(TaskGroup, "num_samples"), max_tokens, True, 4 * _schema_max(TaskGroup, "prompt"))

    @property
    def max_tokens_per_sample(self) -> int:
        """Completion tokens of one sample, the environment's included (multi-turn: the token ids' bin bound)."""
        return MAX_GROUP_BYTES // 4 if self.multi_turn else self.max_model_tokens_per_sample

    @property
    def decode_limits(self) -> DecodeLimits:
        longest_text = min(MAX_GROUP_BYTES, MAX_TEXT_BYTES_PER_TOKEN * self.max_tokens_per_sample)
        return DecodeLimits(
            max_depth=2,
            max_items=NUM_GROUP_FIELDS + NUM_PER_SAMPLE_LISTS * self.num_samples,
            max_array_len=self.num_samples,
            max_map_len=NUM_GROUP_FIELDS,
            max_str_bytes=max(self.prompt_bytes, longest_text, MAX_ID_STR_BYTES),
            max_bin_bytes=MAX_GROUP_BYTES,
        )

    def check(self, group: RolloutGroup) -> None:
        """Raises ValueError naming the first limit `group` breaks: more samples, tokens or text than the task
        allows. (Its decoding already bounded each field; this bounds each sample.)"""
        lengths = unpack_int32(group.completion_lengths)
        if len(lengths) > self.num_samples:
            raise ValueError(f"{len(lengths)} samples, over the task's {self.num_samples}")
        # single-turn: every token is the model's; multi-turn: the model's turns (the environment's are bounded
        # by the group's bytes)
        model_tokens = _model_tokens(group, lengths) if self.multi_turn else lengths
        too_long = np.flatnonzero(model_tokens > self.max_model_tokens_per_sample)
        if len(too_long):
            index = int(too_long[0])
            limit = "max_turns x max_new_tokens" if self.multi_turn else "max_new_tokens"
            raise ValueError(
                f"sample {index} has {int(model_tokens[index])} model tokens, over the task's {limit} "
                f"({self.max_model_tokens_per_sample})"
            )
        for index, (text, length) in enumerate(zip(group.completion_texts, lengths.tolist(), strict=True)):
            if len(text.encode()) > MAX_TEXT_BYTES_PER_TOKEN * length:
                raise ValueError(
                    f"sample {index}'s text is {len(text.encode())} bytes for {length} tokens, over "
                    f"{MAX_TEXT_BYTES_PER_TOKEN} bytes per token"
                )


def largest_group_bytes(run: RunConfig) -> int:
    """The largest RolloutGroup an honest worker of `run` can produce, in encoded bytes: where the run sizes the
    model (tiny-random) every token of a sample fits its context; otherwise MAX_GROUP_BYTES, the most any
    group may be (the run does not bound a prompt's tokens, nor an environment's observations)."""
    if run.model.init != TINY_RANDOM:
        return MAX_GROUP_BYTES
    context_tokens = run.model.max_position_embeddings  # prompt + completion of every sample, all turns
    token_bytes = COMPLETION_BYTES_PER_TOKEN + TINY_RANDOM_TEXT_BYTES_PER_TOKEN
    sample_bytes = context_tokens * token_bytes + SAMPLE_OVERHEAD_BYTES
    prompt_bytes = context_tokens * (4 + TINY_RANDOM_TEXT_BYTES_PER_TOKEN)  # its ids and its text
    return min(MAX_GROUP_BYTES, GROUP_OVERHEAD_BYTES + prompt_bytes + run.grpo.group_size * sample_bytes)


def _model_tokens(group: RolloutGroup, lengths: np.ndarray) -> np.ndarray:
    """(num_samples,) the model's tokens in each sample: all of them without a completion_mask."""
    if not group.completion_mask or len(lengths) == 0:
        return lengths
    sample_of_token = np.repeat(np.arange(len(lengths)), lengths)
    return np.bincount(sample_of_token, weights=unpack_mask(group.completion_mask), minlength=len(lengths))


def _schema_max(model: type[BaseModel], name: str) -> int:
    """A field's upper bound in its schema: `le` of a number, `max_length` of a string."""
    for constraint in model.model_fields[name].metadata:
        if isinstance(constraint, annotated_types.Le):
            return int(typing.cast(int, constraint.le))
        if isinstance(constraint, annotated_types.MaxLen):
            return constraint.max_length
    raise ValueError(f"{model.__name__}.{name} has no upper bound")
