"""A small sampler on a plain torch model, for tests only: the single-process learning check and the
stand-in workers of the learner tests sample with it (tests/selfplay.py). The services have one
inference path, engines/ (the workers' sampling and the learner's held-out evaluation); this one
stays because it runs on the learner's own training model, with no folder or engine around it.

No KV cache: the prompts are a handful of tokens and completions one or two, so re-running the whole
prefix each step costs less than the bookkeeping. Prompts of equal length are decoded together, so
no padding (and no position-id care) is needed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional name)

from engines.interface import Sampling

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # sampled tokens, up to and including EOS when the sample stopped
    logprobs: list[float]  # log-prob of each token under softmax(logits / temperature)
    stopped: bool  # True: ended with EOS; False: hit max_new_tokens

    def text(self, tokenizer: PreTrainedTokenizerBase) -> str:
        """What the verifier scores: the completion without its EOS. Other special tokens stay
        visible (a sampled <pad> is a wrong answer), as in the rollout engine's texts."""
        visible = self.token_ids[:-1] if self.stopped else self.token_ids
        return str(tokenizer.decode(visible, skip_special_tokens=False, clean_up_tokenization_spaces=False))


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    prompts: list[list[int]],
    sampling: Sampling,
    *,
    eos_token_ids: Collection[int],
    generator: torch.Generator | None = None,
) -> list[list[Completion]]:
    """`sampling.num_samples` completions of each prompt (token ids); returned per prompt, in order. A row stops
    at any of `eos_token_ids` (shared.tokenization.eos_token_ids: the workers' set)."""
    num_samples = sampling.num_samples
    was_training = model.training
    model.eval()
    # the learner's run-file device (CPU or CUDA); a parameter-free stand-in model runs on the CPU
    device = next(model.parameters(), torch.empty(0)).device
    by_length: dict[int, list[int]] = defaultdict(list)
    for index, prompt in enumerate(prompts):
        by_length[len(prompt)].append(index)
    results: list[list[Completion]] = [[] for _ in prompts]
    for indices in by_length.values():
        prefix = torch.tensor([prompts[i] for i in indices], dtype=torch.long, device=device)
        prefix = prefix.repeat_interleave(num_samples, dim=0)
        completions = _decode_rows(model, prefix, sampling, eos_token_ids, generator)
        for position, index in enumerate(indices):
            results[index] = completions[position * num_samples : (position + 1) * num_samples]
    model.train(was_training)
    return results


def _decode_rows(
    model: torch.nn.Module,
    prefix: torch.Tensor,
    sampling: Sampling,
    eos_token_ids: Collection[int],
    generator: torch.Generator | None,
) -> list[Completion]:
    num_rows = prefix.shape[0]
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=prefix.device)
    tokens = prefix  # (rows, prompt_len + generated)
    new_tokens, new_logprobs = [], []
    finished = torch.zeros(num_rows, dtype=torch.bool, device=prefix.device)
    for _ in range(sampling.max_new_tokens):
        logits = model(input_ids=tokens).logits[:, -1].float() / sampling.temperature  # (rows, V)
        logprobs = F.log_softmax(logits, dim=-1)
        if sampling.greedy:
            next_token = logprobs.argmax(dim=-1)
        else:
            next_token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
        new_tokens.append(next_token)
        new_logprobs.append(logprobs.gather(-1, next_token[:, None]).squeeze(-1))
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= torch.isin(next_token, eos)
        if finished.all():
            break
    token_matrix = torch.stack(new_tokens, dim=1).tolist()  # (rows, generated)
    logprob_matrix = torch.stack(new_logprobs, dim=1).tolist()
    completions = []
    for row_tokens, row_logprobs in zip(token_matrix, logprob_matrix, strict=True):
        # Keep tokens up to and including the first EOS; what a row generated after it is discarded.
        first_eos = next((i for i, token in enumerate(row_tokens) if token in eos_token_ids), None)
        stopped = first_eos is not None
        length = first_eos + 1 if first_eos is not None else len(row_tokens)
        completions.append(Completion(row_tokens[:length], row_logprobs[:length], stopped))
    return completions
