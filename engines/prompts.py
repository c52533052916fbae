"""Checks every engine makes on the prompts before sampling: encoded with shared.tokenization.encode_prompt,
refusing what the tokenizer cannot represent and what would overflow the context. One home, so the torch and
vLLM engines turn the same prompt into the same ids and refuse the same requests. (The sampling arguments
check themselves when built: engines.interface.Sampling.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engines.interface import PromptTooLongError, UnencodablePromptError
from shared.tokenization import PromptEncodingError, PromptInput, encode_observation, encode_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def encode_checked_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str | PromptInput],
    max_new_tokens: int,
    max_positions: int | None,
) -> list[list[int]]:
    """Token ids of each prompt; raises UnencodablePromptError if the tokenizer would lose characters
    or the chat template fails, PromptTooLongError if prompt + max_new_tokens exceed `max_positions`
    (None: no limit known)."""
    try:
        prompt_ids = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    except PromptEncodingError as exc:
        raise UnencodablePromptError(str(exc)) from exc
    check_prompt_ids(prompt_ids, max_new_tokens, max_positions)
    return prompt_ids


def check_prompt_ids(prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, max_positions: int | None) -> None:
    """Raises ValueError for an empty prompt, PromptTooLongError if prompt + max_new_tokens exceed
    `max_positions` (None: no limit known)."""
    if any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("a prompt has no token ids")
    longest = max(len(ids) for ids in prompt_ids)
    if max_positions is not None and longest + max_new_tokens > max_positions:
        raise PromptTooLongError(
            f"{longest} prompt tokens + {max_new_tokens} new tokens exceed the context of {max_positions}"
        )


def encode_checked_observation(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """An environment's observation as ids to append to a context; raises UnencodablePromptError."""
    try:
        return encode_observation(tokenizer, text)
    except PromptEncodingError as exc:
        raise UnencodablePromptError(str(exc)) from exc
