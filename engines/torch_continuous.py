"""TorchContinuousBatch: continuous batching on the torch engine's KV-cached forward (engines/continuous.py).

The batch is B rows sharing one KV cache of width W, left-padded: row r's context sits in the last columns,
its padding columns are masked out, and every row carries its own position ids, so rows of any length and
age decode together. Per step:

1. a weight change since the last step: re-prefill every running row's whole context (prompt + tokens so
   far) with the new weights (the cache is rebuilt; engines/continuous.py says why);
2. admit waiting rows: prefill their prompts (each distinct prompt once, copied per sample, as the torch
   engine's batch `generate` does) and merge their cache into the batch's: both are left-padded to the
   wider of the two and stacked along the batch;
3. choose one token per row from its pending logits (keyed sampling at the row's own position);
4. retire the rows that finished (EOS or max_new_tokens): their cache rows are dropped, and columns no
   row uses any more are trimmed from the left;
5. one decoding forward for the rows left: their next logits.

Keyed sampling makes a row's tokens a function of its seed, its position and the weights, so a row
sampled here picks the tokens `TorchEngine.generate` picks for the same seed (tests/engines/).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from engines.continuous import (
    ContinuousBatch,
    FinishedSample,
    Row,
    SampleRequest,
    StepStats,
    VersionChange,
    record_change,
)
from engines.interface import Sample
from engines.keyed_tensors import keyed_choice

if TYPE_CHECKING:
    from engines.torch_engine import TorchEngine


KvAfterUpdate = Literal["recompute", "keep"]


@dataclass
class TorchRow(Row):
    stopped: bool = False  # sampled an EOS

    @property
    def context(self) -> list[int]:
        return [*self.request.prompt_ids, *self.token_ids]

    @property
    def done(self) -> bool:
        return self.stopped or len(self.token_ids) >= self.request.sampling.max_new_tokens


@dataclass
class Prefilled:
    """The cache, mask, next positions and pending logits of some rows, in row order."""

    cache: Any  # transformers DynamicCache, (n, heads, width, head_dim) per layer
    attention_mask: torch.Tensor  # (n, width) long: 1 where a column holds a token of the row
    next_position: torch.Tensor  # (n, 1) long
    logits: torch.Tensor  # (n, V) float32


class TorchContinuousBatch(ContinuousBatch):
    def __init__(self, engine: TorchEngine, max_rows: int, kv_after_update: KvAfterUpdate = "recompute") -> None:
        super().__init__(max_rows, engine.max_positions, engine.policy_version)
        self.engine = engine
        # "keep" exists to measure what recomputing buys (benchmarks/continuous_engines.py): the old weights'
        # cache stays, so later tokens come from neither version's distribution given the whole context
        self.kv_after_update = kv_after_update
        self.rows: list[TorchRow] = []
        self.state: Prefilled | None = None  # None iff no row is running

    @property
    def num_running(self) -> int:
        return len(self.rows)

    def abort(self, request_ids: Sequence[int]) -> None:
        dropped = set(request_ids)
        self.drop_waiting(dropped)
        self._keep([index for index, row in enumerate(self.rows) if row.request.request_id not in dropped])

    def step(self) -> list[FinishedSample]:
        with torch.inference_mode():
            recompute_s = self._follow_weights()
            num_admitted = self._admit()
            num_rows = len(self.rows)
            if num_rows:
                self._choose_tokens()
            finished = self._retire()
            if self.rows:
                self._decode()
        self._last_step = StepStats(num_rows, num_admitted, len(finished), recompute_s)
        return finished

    # the step's parts
    def _follow_weights(self) -> float:
        """New weights since the last step: rebuild the running rows' cache with them."""
        version = self.engine.policy_version
        if version == self.policy_version:
            return 0.0
        self.policy_version = version
        if not self.rows:
            return 0.0
        if self.kv_after_update == "keep":  # the pending logits are the old weights': the next token is theirs
            for row in self.rows:
                record_change(row.versions, len(row.token_ids) + 1, version)
            return 0.0
        started_s = time.perf_counter()
        self.state = self._prefill([row.context for row in self.rows])
        for row in self.rows:
            record_change(row.versions, len(row.token_ids), version)
        return time.perf_counter() - started_s

    def _admit(self) -> int:
        admitted = self.take_waiting()
        if not admitted:
            return 0
        new = self._prefill_prompts(admitted)
        self.rows.extend(TorchRow(request, versions=[VersionChange(0, self.policy_version)]) for request in admitted)
        self.state = new if self.state is None else merge(self.state, new)
        return len(admitted)

    def _choose_tokens(self) -> None:
        assert self.state is not None
        temperatures = torch.tensor(
            [row.request.sampling.temperature for row in self.rows], device=self.state.logits.device
        )
        logprobs = torch.log_softmax(self.state.logits / temperatures[:, None], dim=-1)  # (B, V)
        token = torch.empty(len(self.rows), dtype=torch.long, device=logprobs.device)
        seeded = torch.tensor([row.request.seed is not None for row in self.rows], device=logprobs.device)
        if bool(seeded.any()):  # keyed sampling at each row's own completion position
            seeds = [row.request.seed for row in self.rows if row.request.seed is not None]
            positions = [len(row.token_ids) for row in self.rows if row.request.seed is not None]
            token[seeded] = keyed_choice(
                logprobs[seeded].exp(),
                torch.tensor(seeds, dtype=torch.int64, device=logprobs.device),
                torch.tensor(positions, dtype=torch.int64, device=logprobs.device),
            )
        if not bool(seeded.all()):
            token[~seeded] = torch.multinomial(logprobs[~seeded].exp(), num_samples=1).squeeze(-1)
        chosen = logprobs.gather(-1, token[:, None]).squeeze(-1)
        eos = torch.isin(token, self.engine.eos_token_ids)
        for row, token_id, logprob, is_eos in zip(
            self.rows, token.tolist(), chosen.tolist(), eos.tolist(), strict=True
        ):
            row.token_ids.append(token_id)
            row.logprobs.append(logprob)
            row.stopped = is_eos

    def _retire(self) -> list[FinishedSample]:
        finished = [row for row in self.rows if row.done]
        if finished:
            self._keep([index for index, row in enumerate(self.rows) if not row.done])
        return [self._finished(row) for row in finished]

    def _decode(self) -> None:
        assert self.state is not None
        state = self.state
        last_tokens = torch.tensor([[row.token_ids[-1]] for row in self.rows], device=self.engine.device)
        attention_mask = torch.cat([state.attention_mask, state.attention_mask.new_ones((len(self.rows), 1))], dim=1)
        argument = self.engine.cache_argument
        out = self.engine.model(
            input_ids=last_tokens,
            attention_mask=attention_mask,
            position_ids=state.next_position,
            use_cache=True,
            **{argument: state.cache},
        )
        self.state = Prefilled(
            getattr(out, argument), attention_mask, state.next_position + 1, out.logits[:, -1].float()
        )

    # helpers
    def _prefill_prompts(self, requests: list[SampleRequest]) -> Prefilled:
        """Each distinct prompt once, then its cache row copied for every request that shares it."""
        distinct = list(dict.fromkeys(r.prompt_ids for r in requests))
        prefilled = self._prefill([list(ids) for ids in distinct])
        order = {ids: index for index, ids in enumerate(distinct)}
        return select(prefilled, torch.tensor([order[r.prompt_ids] for r in requests], device=self.engine.device))

    def _prefill(self, contexts: list[list[int]]) -> Prefilled:
        input_ids, attention_mask = self.engine.left_pad(contexts)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.engine.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = getattr(out, self.engine.cache_argument)
        return Prefilled(cache, attention_mask, position_ids[:, -1:] + 1, out.logits[:, -1].float())

    def _keep(self, indices: list[int]) -> None:
        """Keep only these running rows (in order)."""
        if len(indices) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in indices]
        if not indices or self.state is None:
            self.state = None
            return
        self.state = trim(select(self.state, torch.tensor(indices, device=self.engine.device)))

    def _finished(self, row: TorchRow) -> FinishedSample:
        visible = row.token_ids[:-1] if row.stopped else row.token_ids  # the text excludes EOS
        text = str(self.engine.tokenizer.decode(visible, clean_up_tokenization_spaces=False))
        sample = Sample(
            prompt_token_ids=list(row.request.prompt_ids),
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            text=text,
            finish_reason="stop" if row.stopped else "length",
        )
        versions = tuple(change for change in row.versions if change.token_index < len(row.token_ids))
        return FinishedSample(row.request.request_id, sample, versions)


def cache_layers(cache: Any) -> list[Any]:
    """The cache's layers, each holding `keys` and `values` of shape (rows, heads, width, head_dim)."""
    layers = list(cache.layers)
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        raise NotImplementedError("continuous batching needs full-attention layers (no sliding-window cache)")
    return layers


def select(state: Prefilled, rows: torch.Tensor) -> Prefilled:
    """These rows of `state`, in the order given (a row may repeat)."""
    for layer in cache_layers(state.cache):
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]
    return Prefilled(state.cache, state.attention_mask[rows], state.next_position[rows], state.logits[rows])


def merge(old: Prefilled, new: Prefilled) -> Prefilled:
    """`old`'s rows then `new`'s, both left-padded to the wider cache."""
    width = max(old.attention_mask.shape[1], new.attention_mask.shape[1])
    for old_layer, new_layer in zip(cache_layers(old.cache), cache_layers(new.cache), strict=True):
        old_layer.keys = torch.cat([pad_left(old_layer.keys, width, dim=2), pad_left(new_layer.keys, width, dim=2)])
        old_layer.values = torch.cat(
            [pad_left(old_layer.values, width, dim=2), pad_left(new_layer.values, width, dim=2)]
        )
    attention_mask = torch.cat([pad_left(old.attention_mask, width, dim=1), pad_left(new.attention_mask, width, dim=1)])
    return Prefilled(
        old.cache,
        attention_mask,
        torch.cat([old.next_position, new.next_position]),
        torch.cat([old.logits, new.logits]),
    )


def trim(state: Prefilled) -> Prefilled:
    """Drop the leading columns that no row uses (after the longest rows left)."""
    used = state.attention_mask.any(dim=0).nonzero()
    first = int(used[0]) if len(used) else state.attention_mask.shape[1]
    if first == 0:
        return state
    for layer in cache_layers(state.cache):
        layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
    return Prefilled(state.cache, state.attention_mask[:, first:], state.next_position, state.logits)


def pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros prepended along `dim` up to `width`."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
