"""Chat prompts for the tasks meant for real (instruct) tokenizers, and the alphabet that lets the tiny
demo model run them anyway.

A prompt is a system turn (the answer format) and a user turn (the problem). A tokenizer with a chat
template renders the messages; one without (the demo's character tokenizer) encodes `TaskPrompt.prompt`,
the same two turns as plain text (shared/tokenization.py encode_prompt).
"""

from __future__ import annotations

from shared.messages import ChatMessage
from shared.tasks.base import TaskPrompt

# Every printable ASCII character and the newline: what the generated tasks' prompts and answers use, so
# `init = "tiny-random"` builds a character tokenizer that covers them (it will not learn these tasks;
# the point is that the pipeline runs end to end). A user's file with other characters needs a real
# tokenizer ([model] path).
PRINTABLE_ASCII = "".join(chr(code) for code in range(32, 127)) + "\n"


def chat_prompt(system: str, user: str, reference: str) -> TaskPrompt:
    """A system + user prompt; its plain form is the two turns separated by a blank line."""
    messages = (ChatMessage(role="system", content=system), ChatMessage(role="user", content=user))
    return TaskPrompt(f"{system}\n\n{user}\n", reference, messages)


def unique_by_prompt(prompts: list[TaskPrompt]) -> list[TaskPrompt]:
    """The first prompt of each distinct text, in order: generators repeat short problems, and a repeat
    on both sides of the held-out split would leak an eval question into training."""
    seen: set[str] = set()
    unique = []
    for prompt in prompts:
        if prompt.prompt not in seen:
            seen.add(prompt.prompt)
            unique.append(prompt)
    return unique


def user_turn(prompt: TaskPrompt) -> str:
    """The problem as the user wrote it (a chat prompt's last turn; the raw prompt otherwise)."""
    return prompt.messages[-1].content if prompt.messages else prompt.prompt
