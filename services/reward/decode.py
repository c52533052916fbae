"""Completion text from the token ids the learner trains on: the reward service decodes them itself.

A worker sends both `completion_token_ids` (what the learner trains on) and `completion_texts` (what it
says those ids read as). Scoring the text would let a worker pair wrong ids with the right answer and
invert the training signal, so the text is decoded here from the ids and the worker's text is only
compared with it (a difference is counted per worker, never scored).

The decoding rule is the engines' (engines/torch_engine.py and engines/vllm_engine.py `_to_samples`):
drop the final EOS of a sample that stopped, then `tokenizer.decode(ids, clean_up_tokenization_spaces=False)`
with special tokens kept. A transformers fast tokenizer's decode is exactly its Rust backend's
`Tokenizer.decode(ids, skip_special_tokens=False)`, which is what this module loads from the folder's
tokenizer.json with the `tokenizers` package: no torch, no transformers. So an honest worker's text is
the decoded text (pinned by tests/unit/test_reward_decode.py on the demo's folder and on BPE folders).

The ids are checked first; a group that fails a check is dead-lettered with the reason
(`InvalidTokensError`): prompt ids that are not the task's prompt (raw-text tasks: `check_prompt`; the
rules of shared.tokenization.encode_prompt; chat prompts would need transformers' template renderer and
are not checked here), an id outside the model's vocabulary, a completion longer than max_new_tokens,
an EOS id anywhere but at the end of a sample that stopped, a sample that says it stopped without one,
non-finite behaviour log-probs. Lengths that do not add up and a log-prob count that differs from the
token count are already refused when the message is decoded (`RolloutGroup._arrays_agree`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from shared.messages import RolloutGroup, unpack_float32, unpack_int32
from shared.tokenization import ModelFolderError, generation_eos_ids, read_config, tokenizer_eos_token


class InvalidTokensError(ValueError):
    """A rollout whose token arrays no honest engine produces: dead-lettered with the reason."""


class CompletionDecoder:
    """The run's tokenizer (tokenizer.json of the model folder), its EOS ids and vocabulary size."""

    def __init__(self, model_dir: Path, max_new_tokens: int) -> None:
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelFolderError(
                f"{model_dir} has no tokenizer.json: the reward service decodes token ids with the `tokenizers` "
                "package, which reads a fast tokenizer's file (save the tokenizer with transformers' "
                "save_pretrained from AutoTokenizer, which writes it)"
            )
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        # The model's embedding decides which ids exist (Qwen pads it past the tokenizer's last id).
        config_vocab = read_config(model_dir).get("vocab_size")
        self.vocab_size = (
            int(config_vocab)
            if isinstance(config_vocab, int)
            else self.tokenizer.get_vocab_size(with_added_tokens=True)
        )
        eos_ids = set(generation_eos_ids(model_dir))
        eos_token = tokenizer_eos_token(model_dir)
        eos_id = self.tokenizer.token_to_id(eos_token) if eos_token is not None else None
        if eos_id is not None:
            eos_ids.add(eos_id)
        if not eos_ids:
            raise ModelFolderError(f"{model_dir}: no EOS token in the tokenizer or the generation config")
        self.eos_ids = np.array(sorted(eos_ids), dtype=np.int64)
        self.max_new_tokens = max_new_tokens

    def check_prompt(self, group: RolloutGroup, prompt: str) -> None:
        """The prompt ids must be the task's raw-text prompt encoded as workers encode it
        (shared.tokenization.encode_prompt: with the tokenizer's special tokens, e.g. a BOS)."""
        expected = self.tokenizer.encode(prompt, add_special_tokens=True).ids
        got = group.prompt_tokens().tolist()
        if got != expected:
            shown = self.tokenizer.decode(got[:64], skip_special_tokens=False)
            raise InvalidTokensError(f"prompt_token_ids are not the task's prompt {prompt[:64]!r}: they read {shown!r}")

    def decode(self, group: RolloutGroup) -> list[str]:
        """One text per sample, decoded from its completion ids (EOS excluded); raises InvalidTokensError."""
        ids = unpack_int32(group.completion_token_ids)  # (num_tokens,) all samples, concatenated
        lengths = unpack_int32(group.completion_lengths)  # (num_samples,)
        stopped = np.array([reason == "stop" for reason in group.finish_reasons])  # (num_samples,)
        self.check(group, ids, lengths, stopped)
        ends = np.cumsum(lengths)  # (num_samples,)
        starts = [0, *ends[:-1].tolist()]
        visible_ends = (ends - stopped).tolist()  # a stopped sample's last id is its EOS
        id_list = ids.tolist()
        # One decode call per sample: decode_batch's thread pool costs more than it saves on short samples.
        return [
            self.tokenizer.decode(id_list[start:end], skip_special_tokens=False)
            for start, end in zip(starts, visible_ends, strict=True)
        ]

    def check_ids_and_logprobs(self, group: RolloutGroup, ids: np.ndarray) -> None:
        for name, values in (("prompt", group.prompt_tokens()), ("completion", ids)):
            outside = values[(values < 0) | (values >= self.vocab_size)]
            if outside.size:
                raise InvalidTokensError(
                    f"{name} token id {int(outside[0])} is outside the vocabulary [0, {self.vocab_size})"
                )
        if not np.isfinite(unpack_float32(group.behaviour_logprobs)).all():
            raise InvalidTokensError("non-finite behaviour log-probs")

    def check(self, group: RolloutGroup, ids: np.ndarray, lengths: np.ndarray, stopped: np.ndarray) -> None:
        """Vectorised over the whole group (this runs for every group the service scores)."""
        self.check_ids_and_logprobs(group, ids)
        too_long = np.flatnonzero(lengths > self.max_new_tokens)
        if too_long.size:
            index = int(too_long[0])
            raise InvalidTokensError(
                f"sample {index} has {int(lengths[index])} tokens, more than max_new_tokens {self.max_new_tokens}"
            )
        # Engines stop at the first EOS and keep it as the last token: an EOS id is there iff "stop".
        ends = np.cumsum(lengths)
        is_eos = (ids[:, None] == self.eos_ids[None, :]).any(axis=1)  # (num_tokens,)
        last_is_eos = np.zeros(len(lengths), dtype=bool)
        has_tokens = lengths > 0
        last_is_eos[has_tokens] = is_eos[ends[has_tokens] - 1]
        missing = np.flatnonzero(stopped & ~last_is_eos)
        if missing.size:
            raise InvalidTokensError(f"sample {int(missing[0])} says it stopped but does not end with an EOS id")
        is_eos[ends[stopped] - 1] = False  # the allowed ones; any EOS left is inside a sample
        inner = np.flatnonzero(is_eos)
        if inner.size:
            index = int(np.searchsorted(ends, inner[0], side="right"))
            raise InvalidTokensError(f"sample {index} goes on after an EOS id")

    def decode_episodes(self, group: RolloutGroup, max_turns: int) -> list[DecodedEpisode]:
        """Multi-turn samples (docs/environments.md#the-masked-rollout-format): each sample's model turns
        decoded (the actions the replay plays) and its observation ids (which the replay's observations
        must encode to); raises InvalidTokensError. A group without a mask is one turn per sample."""
        self.check_ids_and_logprobs(group, unpack_int32(group.completion_token_ids))
        episodes = []
        for index, (tokens, mask, reason) in enumerate(
            zip(group.sample_tokens(), group.sample_masks(), group.finish_reasons, strict=True)
        ):
            spans = split_spans(tokens.tolist(), mask.tolist())
            self.check_turns(index, spans, reason == "stop", max_turns)
            episodes.append(self.decode_spans(spans))
        return episodes

    def check_turns(self, index: int, spans: list[tuple[bool, list[int]]], stopped: bool, max_turns: int) -> None:
        """An engine's turn ends at its first EOS or after max_new_tokens; the last turn's end says `stopped`."""
        turns = [span for is_model, span in spans if is_model]
        if not turns:
            raise InvalidTokensError(f"sample {index} has no model turn")
        if len(turns) > max_turns:
            raise InvalidTokensError(f"sample {index} has {len(turns)} model turns, more than max_turns {max_turns}")
        for number, turn in enumerate(turns):
            is_eos = np.isin(np.array(turn), self.eos_ids)
            if is_eos[:-1].any():
                raise InvalidTokensError(f"sample {index} turn {number} goes on after an EOS id")
            if len(turn) > self.max_new_tokens:
                raise InvalidTokensError(
                    f"sample {index} turn {number} has {len(turn)} tokens, more than max_new_tokens {self.max_new_tokens}"
                )
            if not is_eos[-1] and len(turn) != self.max_new_tokens:
                raise InvalidTokensError(f"sample {index} turn {number} ends before max_new_tokens without an EOS id")
        if stopped != bool(np.isin(turns[-1][-1], self.eos_ids)):
            raise InvalidTokensError(
                f"sample {index}: finish reason {'stop' if stopped else 'length'} disagrees with its last token"
            )

    def decode_spans(self, spans: list[tuple[bool, list[int]]]) -> DecodedEpisode:
        actions, observation_ids, text = [], [], ""
        for is_model, span in spans:
            if is_model:
                visible = span[:-1] if np.isin(span[-1], self.eos_ids) else span
                action = self.tokenizer.decode(visible, skip_special_tokens=False)
                actions.append(action)
                text += action
            else:
                observation_ids.append(span)
                text += self.tokenizer.decode(span, skip_special_tokens=False)
        return DecodedEpisode(actions, observation_ids, text)

    def encode_observation(self, text: str) -> list[int]:
        """shared.tokenization.encode_observation's rule with `tokenizers`: no special tokens, "" -> []."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else []


@dataclass(frozen=True)
class DecodedEpisode:
    actions: list[str]  # each model turn's text, EOS excluded: what the replay plays
    observation_ids: list[list[int]]  # each environment span's ids, in order
    text: str  # turns and observations concatenated: what an honest worker's completion text is


def split_spans(tokens: list[int], mask: list[bool]) -> list[tuple[bool, list[int]]]:
    """Runs of equal mask: [(is_model, ids), ...], alternating, starting and ending with a model turn."""
    spans: list[tuple[bool, list[int]]] = []
    for token, is_model in zip(tokens, mask, strict=True):
        if spans and spans[-1][0] == is_model:
            spans[-1][1].append(token)
        else:
            spans.append((is_model, [token]))
    return spans
