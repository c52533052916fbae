"""Prompt checks every engine makes before sampling: encode with shared.tokenization.encode_prompt,
refuse what the tokenizer cannot represent, refuse what would overflow the context. One home, so the
torch and vLLM engines turn the same prompt into the same ids and refuse the same prompts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engines.interface import PromptTooLongError, UnencodablePromptError
from shared.tokenization import PromptEncodingError, PromptInput, encode_prompt

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
    longest = max(len(ids) for ids in prompt_ids)
    if max_positions is not None and longest + max_new_tokens > max_positions:
        raise PromptTooLongError(
            f"{longest} prompt tokens + {max_new_tokens} new tokens exceed the context of {max_positions}"
        )
    return prompt_ids
