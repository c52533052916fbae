"""The wire form of a task's samples: one RolloutGroup, from single-turn samples or multi-turn episodes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from shared.messages import FinishReason, RolloutGroup, TaskGroup, pack_float32, pack_int32


class SampledText(Protocol):
    """What a group is built from: engines.interface.Sample (one turn) or engines.episodes.Episode."""

    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float]: ...
    @property
    def text(self) -> str: ...
    @property
    def finish_reason(self) -> FinishReason: ...


def build_rollout_group(
    task: TaskGroup,
    samples: Sequence[SampledText],
    worker_id: str,
    policy_version: int,
    generation_s: float,
    **masked_fields: object,
) -> RolloutGroup:
    """The group of one task's samples. `generation_s` is the wall time of the engine call(s) that
    produced them (shared by every group of a batched call: the latency the group actually had).
    `masked_fields`: a multi-turn group's `completion_mask` and `env_rewards` (services/rollout/episodes.py)."""
    return RolloutGroup(
        run_id=task.run_id,
        group_id=uuid.uuid4().hex,
        task_id=task.task_id,
        task_name=task.task_name,
        prompt=task.prompt,
        worker_id=worker_id,
        policy_version=policy_version,
        temperature=task.temperature,
        prompt_token_ids=pack_int32(samples[0].prompt_token_ids),
        completion_token_ids=pack_int32([token for sample in samples for token in sample.token_ids]),
        completion_lengths=pack_int32([len(sample.token_ids) for sample in samples]),
        behaviour_logprobs=pack_float32([logprob for sample in samples for logprob in sample.logprobs]),
        completion_texts=[sample.text for sample in samples],
        finish_reasons=[sample.finish_reason for sample in samples],
        generation_s=generation_s,
        **masked_fields,  # type: ignore[arg-type]
    )
