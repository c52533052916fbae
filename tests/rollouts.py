"""Rollout groups as an honest (or lying) worker would post them, with real token ids of the tiny policy's
tokenizer, so the reward service, which scores what the ids decode to, accepts them."""

from __future__ import annotations

import uuid

from tokenizers import Tokenizer

from shared.messages import RolloutGroup, TaskGroup, pack_float32, pack_int32


def unsigned_rollout_for(
    task: TaskGroup,
    texts: list[str],
    tokenizer: Tokenizer,
    *,
    task_id: str | None = None,
    claimed_texts: list[str] | None = None,
    worker_id: str = "w-test",
    **fields: object,
) -> RolloutGroup:
    """The group an honest worker sends for these completion texts (ended by EOS, or cut at
    max_new_tokens); with `claimed_texts`, a liar's: the ids of `texts`, but `claimed_texts` as the text."""
    eos_id = tokenizer.token_to_id("<eos>")
    encoded = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    stopped = [len(ids) < task.max_new_tokens for ids in encoded]
    samples = [ids + [eos_id] if stop else ids for ids, stop in zip(encoded, stopped, strict=True)]
    token_ids = [token for sample in samples for token in sample]
    return RolloutGroup(
        run_id=task.run_id,
        group_id=uuid.uuid4().hex,
        task_id=task_id or task.task_id,
        task_name=task.task_name,
        prompt=task.prompt,
        worker_id=worker_id,
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32(tokenizer.encode(task.prompt).ids),  # the worker encodes with special tokens
        completion_token_ids=pack_int32(token_ids),
        completion_lengths=pack_int32([len(sample) for sample in samples]),
        behaviour_logprobs=pack_float32([-1.0] * len(token_ids)),
        completion_texts=claimed_texts or texts,
        finish_reasons=["stop" if stop else "length" for stop in stopped],
        generation_s=0.01,
    ).model_copy(update=fields)
