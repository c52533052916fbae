"""How far an honest engine's log-probs may sit from the learner's: measured on the policy being trained,
not a constant (docs/trust.md#the-exact-checks-tolerance).

An honest worker's behaviour log-probs mu differ from the learner's recomputation only by the two sides'
arithmetic. In float32 on both sides that is ~1e-6 nats per token. bf16 anywhere (a bf16 vLLM worker,
the learner's bf16 compute under mixed precision) rounds every matmul to 8 significant bits, and how much
that moves a log-prob depends on the model: ~0.004 nats per token on a random-init model, ~0.04-0.05 on a
pretrained one (its distributions are sharp, so small logit errors move the chosen token's log-prob more).
A fixed tolerance is either too tight for real models or too loose for tiny ones.

So the learner measures it. Each step it takes `numerics_rows` random rows of the batch and computes their
log-probs twice, with a bf16 copy of the policy (every operation rounded, as in a bf16 engine) and in
float32:

    reference = mean over their completion tokens of |log pi_bf16 - log pi_fp32|    (nats per token)

That is one bf16 engine's rounding of this very policy on tokens it sampled. Any honest pairing is within
a small multiple of it (fp32/fp32: ~0; a bf16 engine against a float32 learner: ~1x; against a
mixed-precision learner's bf16 compute, two independent roundings: ~1-1.5x). The exact checks' tolerance is

    max(audit_tolerance_nats, NUMERICS_FACTOR * median of the last NUMERICS_WINDOW_STEPS references)

A worker cannot widen it for itself: the learner computes both sides of the reference from the published
policy, on rows chosen at random across every worker's groups, and takes a median over steps.
"""

from __future__ import annotations

import copy
import random
import statistics
from collections import deque

import torch

from services.learner.batch import TrainBatch
from services.learner.grpo import token_logprobs
from shared.config import TrustConfig

NUMERICS_FACTOR = 3.0  # honest bf16 engines against a bf16-compute learner were measured at 1.2-1.5x the reference
NUMERICS_WINDOW_STEPS = 16  # steps whose references the tolerance takes the median of


class NumericsReference:
    """The running bf16-rounding reference of the policy and the exact checks' tolerance derived from it."""

    def __init__(self, config: TrustConfig, seed: int | None = None) -> None:
        self.config = config
        self.references_nats: deque[float] = deque(maxlen=NUMERICS_WINDOW_STEPS)
        self._rng = random.Random(seed)  # None: from the OS, so no worker can know which rows are measured
        self._bf16_copy: torch.nn.Module | None = None  # the policy in bf16, refreshed per measurement
        self._float32_copy: torch.nn.Module | None = None  # for a policy whose own weights are not float32

    @property
    def tolerance_nats(self) -> float:
        """The tolerance of an exact comparison (mean |log mu - log pi_v| over a group's tokens)."""
        if not self.references_nats:
            return self.config.audit_tolerance_nats
        measured = NUMERICS_FACTOR * statistics.median(self.references_nats)
        return max(self.config.audit_tolerance_nats, measured)

    def measure(self, model: torch.nn.Module, tensors: TrainBatch) -> float | None:
        """Add one step's reference from `numerics_rows` random rows of `tensors` (rows without a
        completion token are skipped); returns it (None: nothing measured)."""
        candidates = torch.nonzero(tensors.completion_mask.any(dim=1)).flatten().tolist()
        if self.config.numerics_rows == 0 or not candidates:
            return None
        rows = torch.tensor(sorted(self._rng.sample(candidates, min(self.config.numerics_rows, len(candidates)))))
        device = next(model.parameters()).device
        input_ids = tensors.input_ids[rows].to(device)
        attention_mask = tensors.attention_mask[rows].to(device)
        temperatures = tensors.temperatures[rows].to(device)
        with torch.no_grad():
            bf16_model, float32_model = self.copies(model)
            bf16 = token_logprobs(bf16_model, input_ids, attention_mask, temperatures).cpu()  # type: ignore[arg-type]
            float32 = token_logprobs(float32_model, input_ids, attention_mask, temperatures).cpu()  # type: ignore[arg-type]
        mask = tensors.completion_mask[rows]  # (r, T - 1)
        reference = float(((bf16 - float32).abs() * mask).sum() / mask.sum())
        self.references_nats.append(reference)
        return reference

    def copies(self, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
        """(a bf16 copy of `model`'s current weights, `model` in float32): the bf16 side rounds every
        operation as a bf16 engine does (weights, activations, norms), which autocast would not. Copies
        are kept and refreshed in place; `model` itself serves as the float32 side when it is float32."""
        self._bf16_copy = self._refreshed(self._bf16_copy, model, torch.bfloat16)
        if all(parameter.dtype == torch.float32 for parameter in model.parameters()):
            return self._bf16_copy, model
        self._float32_copy = self._refreshed(self._float32_copy, model, torch.float32)
        return self._bf16_copy, self._float32_copy

    @staticmethod
    def _refreshed(copied: torch.nn.Module | None, model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        if copied is None:
            return copy.deepcopy(model).to(dtype).eval().requires_grad_(False)
        copied.load_state_dict(model.state_dict())  # cast to the copy's dtype
        return copied
