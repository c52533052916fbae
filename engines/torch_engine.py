"""TorchEngine: batched sampling with a KV cache on a Hugging Face causal LM from a local folder.

The rollout workers sample with it (CPU, float32) and the learner's held-out evaluation decodes with it
greedily (services/learner/evaluator.py: the learner's device and dtype, weights handed over in memory
with `load_state_dict`), so both stop, encode and decode the same way.

One `generate` call samples every prompt x sampling.num_samples at once:
1. prefill the distinct prompts once (left-padded, explicit position ids), then copy their KV cache
   num_samples times: the prompt is computed once per prompt, not once per sample;
2. decode one token per step for all rows; a row that sampled EOS is finished: it keeps riding
   along (padded), its later tokens and logprobs are discarded;
3. stop when every row finished or after max_new_tokens (no forward after the last token).

Not thread-safe: the worker calls `generate` and `load_weights` from one thread, so a weight swap
always falls between two groups; the learner's evaluator likewise uses its engine from its eval thread only.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engines.interface import InferenceEngine, Sample, Sampling
from engines.keyed_tensors import keyed_choice
from engines.prompts import check_prompt_ids, encode_checked_observation, encode_checked_prompts
from shared.tokenization import PromptInput, check_model_folder, eos_token_ids, model_fingerprint, pad_token_id
from shared.weight_channel import Buffer, LoraAdapter, check_adapter_fits, check_state_fits, parse_blob

if TYPE_CHECKING:
    from engines.torch_continuous import TorchContinuousBatch

log = logging.getLogger(__name__)


class TorchEngine(InferenceEngine):
    def __init__(
        self, model_dir: Path | str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = Path(model_dir)
        check_model_folder(self.model_dir)
        self.device = torch.device(device)
        self.dtype = dtype  # the learner's evaluator matches its training dtype (bfloat16 on CUDA)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype)
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]  # transformers types .to() for models only
        self.pad_token_id = pad_token_id(self.tokenizer)
        self.eos_token_ids = torch.tensor(sorted(eos_token_ids(self.model_dir, self.tokenizer)), device=self.device)
        self.model_fingerprint = model_fingerprint(self.model_dir)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.ties_output_to_input = (
            self.model.get_output_embeddings().weight is self.model.get_input_embeddings().weight
        )
        # LoRA: the base weight of every layer an adapter changed, kept the first time it is changed
        self._lora_base: dict[str, torch.Tensor] = {}

    def generate_from_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        if not prompt_ids:
            return []
        check_prompt_ids(prompt_ids, sampling.max_new_tokens, self.max_positions)
        rows = [list(ids) for ids in prompt_ids]
        row_seeds = keyed_row_seeds(sampling_seeds, len(rows), sampling.num_samples)
        with torch.inference_mode():
            tokens, logprobs, lengths, stopped = self._sample(rows, sampling, row_seeds)
        return self._to_samples(rows, sampling.num_samples, tokens, logprobs, lengths, stopped)

    def encode_prompts(self, prompts: Sequence[str | PromptInput], max_new_tokens: int = 0) -> list[list[int]]:
        """Token ids of each prompt, checked (engines/prompts.py: the vLLM engine encodes the same way)."""
        return encode_checked_prompts(self.tokenizer, prompts, max_new_tokens, self.max_positions)

    def encode_observation(self, text: str) -> list[int]:
        return encode_checked_observation(self.tokenizer, text)

    def load_weights(self, safetensors_bytes: Buffer, policy_version: int, path: Path | None = None) -> None:
        state = self._validated_state_dict(safetensors_bytes)  # views of the buffer; loading is the one copy
        self.model.load_state_dict(state, strict=False)  # keys and shapes were checked above
        self._lora_base.clear()  # these weights are the base a later adapter applies to
        self._policy_version = policy_version
        log.info(
            "loaded policy version %d (%d tensors, %d bytes)",
            policy_version,
            len(state),
            memoryview(safetensors_bytes).nbytes,
        )

    def load_state_dict(self, state: dict[str, torch.Tensor], policy_version: int) -> None:
        """`load_weights` for tensors already in memory (the learner's evaluator hands over a snapshot of
        its policy): the same checks, then a copy into the engine's parameters (cast to its dtype and
        device). Raises WeightsLoadError and keeps the old weights and version if `state` does not fit."""
        self._check_fits(state)
        self.model.load_state_dict(state, strict=False)  # keys and shapes were checked above
        self._lora_base.clear()
        self._policy_version = policy_version
        log.debug("loaded policy version %d from memory (%d tensors)", policy_version, len(state))

    def load_adapter(self, adapter_bytes: Buffer, adapter: LoraAdapter, policy_version: int) -> None:
        """Merged, onto a copy of the base: W = W_base + (alpha / r) B A for every adapted layer, so
        sampling runs the plain model (no per-token adapter cost) and a version never builds on the
        previous one's rounding. The base copy costs the adapted layers' weights once."""
        modules = dict(self.model.named_modules())
        weight_shapes = {
            f"{name}.weight": tuple(module.weight.shape)
            for name, module in modules.items()
            if isinstance(module, torch.nn.Linear)
        }
        pairs = check_adapter_fits(adapter_bytes, adapter, weight_shapes)
        with torch.no_grad():
            for name, (lora_a, lora_b) in pairs.items():
                weight = modules[name].weight
                base = self._lora_base.setdefault(name, weight.detach().clone())
                delta = (
                    lora_b.to(self.device, torch.float32) @ lora_a.to(self.device, torch.float32)
                ) * adapter.scaling
                weight.copy_(base.float() + delta)  # (out, in), cast back to the engine's dtype
        self._policy_version = policy_version
        log.info(
            "loaded policy version %d: LoRA r=%d on %d layers (%d bytes)",
            policy_version,
            adapter.rank,
            len(pairs),
            memoryview(adapter_bytes).nbytes,
        )

    def continuous_batch(self, max_rows: int) -> TorchContinuousBatch:
        """A continuous batch of at most `max_rows` rows on this engine (engines/torch_continuous.py)."""
        from engines.torch_continuous import TorchContinuousBatch

        return TorchContinuousBatch(self, max_rows)

    @property
    def cache_argument(self) -> str:
        return kv_cache_argument(self.model)  # per call: tests swap the model for a stand-in

    # sampling
    def _sample(
        self, prompt_ids: list[list[int]], sampling: Sampling, row_seeds: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (B, N) tokens, (B, N) logprobs, (B,) completion lengths, (B,) stopped-at-EOS flags,
        with B = len(prompt_ids) * num_samples in prompt-major order and N = max_new_tokens.
        row_seeds: (B,) keyed sampling's seed per row (None: torch's generator)."""
        num_samples, max_new_tokens = sampling.num_samples, sampling.max_new_tokens
        input_ids, attention_mask = self.left_pad(prompt_ids)  # (P, L) each
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # pads sit at 0; real tokens count from 0
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        cache_argument = self.cache_argument
        cache = getattr(out, cache_argument)
        cache.batch_repeat_interleave(num_samples)  # (P, ...) -> (B, ...): sample j of prompt i is row i*G + j
        logits = out.logits[:, -1].repeat_interleave(num_samples, dim=0)  # (B, V)
        attention_mask = attention_mask.repeat_interleave(num_samples, dim=0)  # (B, L)
        next_position = position_ids[:, -1:].repeat_interleave(num_samples, dim=0) + 1  # (B, 1)

        num_rows = logits.shape[0]
        tokens = torch.full((num_rows, max_new_tokens), self.pad_token_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((num_rows, max_new_tokens), dtype=torch.float32, device=self.device)
        lengths = torch.full((num_rows,), max_new_tokens, dtype=torch.long, device=self.device)
        finished = torch.zeros(num_rows, dtype=torch.bool, device=self.device)
        for step in range(max_new_tokens):
            token, logprob = choose_tokens(logits, sampling, row_seeds, step)
            token = token.masked_fill(finished, self.pad_token_id)
            tokens[:, step] = token
            logprobs[:, step] = logprob.masked_fill(finished, 0.0)
            just_stopped = ~finished & torch.isin(token, self.eos_token_ids)
            lengths[just_stopped] = step + 1
            finished |= just_stopped
            if step == max_new_tokens - 1 or bool(finished.all()):
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((num_rows, 1))], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention_mask,
                position_ids=next_position,
                use_cache=True,
                **{cache_argument: cache},
            )
            logits = out.logits[:, -1]
            next_position = next_position + 1
        return tokens, logprobs, lengths, finished

    def left_pad(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(P, L) ids and attention mask of the prompts, each right-aligned (left padding)."""
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for row, ids in enumerate(prompt_ids):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _to_samples(
        self,
        prompt_ids: list[list[int]],
        num_samples: int,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        lengths: torch.Tensor,
        stopped: torch.Tensor,
    ) -> list[list[Sample]]:
        token_rows, logprob_rows = tokens.tolist(), logprobs.tolist()
        length_list, stopped_list = lengths.tolist(), stopped.tolist()
        completions = [tuple(token_row[:length]) for token_row, length in zip(token_rows, length_list, strict=True)]
        visible = [
            c[:-1] if stop else c for c, stop in zip(completions, stopped_list, strict=True)
        ]  # text excludes EOS
        distinct = list(dict.fromkeys(visible))  # tiny vocabularies repeat completions: decode each once
        texts = dict(
            zip(
                distinct,
                self.tokenizer.batch_decode([list(c) for c in distinct], clean_up_tokenization_spaces=False),
                strict=True,
            )
        )
        return [
            [
                Sample(
                    prompt_token_ids=ids,
                    token_ids=list(completions[row]),
                    logprobs=logprob_rows[row][: length_list[row]],
                    text=texts[visible[row]],
                    finish_reason="stop" if stopped_list[row] else "length",
                )
                for row in range(prompt_index * num_samples, (prompt_index + 1) * num_samples)
            ]
            for prompt_index, ids in enumerate(prompt_ids)
        ]

    # weights
    def _validated_state_dict(self, safetensors_bytes: Buffer) -> dict[str, torch.Tensor]:
        """The blob's tensors, after checking they fit the model exactly; raises WeightsLoadError."""
        state = parse_blob(safetensors_bytes)
        self._check_fits(state)
        return state

    def _check_fits(self, state: dict[str, torch.Tensor]) -> None:
        expected_shapes = {name: tuple(tensor.shape) for name, tensor in self.model.state_dict().items()}
        check_state_fits(state, expected_shapes, self.ties_output_to_input)


def kv_cache_argument(model: torch.nn.Module) -> str:
    """The name under which this transformers version's forward takes and returns the KV cache: `cache` from
    5.2x on, `past_key_values` before (deprecated there, removed in 5.40); vLLM's environment pins an older one."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def keyed_row_seeds(sampling_seeds: Sequence[int] | None, num_prompts: int, num_samples: int) -> torch.Tensor | None:
    """(B,) the keyed-sampling seed of each row in prompt-major order: sampling_seeds[i] + j for sample j of
    prompt i (shared/keyed_sampling.py); None without seeds."""
    if sampling_seeds is None:
        return None
    if len(sampling_seeds) != num_prompts:
        raise ValueError(f"{len(sampling_seeds)} sampling seeds for {num_prompts} prompts")
    return (torch.tensor(list(sampling_seeds), dtype=torch.int64)[:, None] + torch.arange(num_samples)).reshape(-1)


def choose_tokens(
    logits: torch.Tensor, sampling: Sampling, row_seeds: torch.Tensor | None = None, position: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) logits -> (B,) chosen tokens and their (B,) logprobs under softmax(logits / temperature).
    With row_seeds ((B,) ints): keyed sampling at completion `position` (shared/keyed_sampling.py)."""
    logprobs = torch.log_softmax(logits.float() / sampling.temperature, dim=-1)  # (B, V)
    if sampling.greedy:
        token = logprobs.argmax(dim=-1)
    elif row_seeds is not None:
        positions = torch.full_like(row_seeds, position)
        token = keyed_choice(logprobs.exp(), row_seeds.to(logprobs.device), positions.to(logprobs.device))
    else:
        token = torch.multinomial(logprobs.exp(), num_samples=1).squeeze(-1)
    return token, logprobs.gather(-1, token[:, None]).squeeze(-1)
