"""Engine samples as the learner's batch rows: right-padded prompt + completion, for benchmarks that score
samples outside a cluster (trust_power, provenance_power)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.interface import Sample


@dataclass(frozen=True)
class SampleRows:
    input_ids: torch.Tensor  # (B, T) long, right-padded
    attention_mask: torch.Tensor  # (B, T) long, 0 on padding
    completion_mask: torch.Tensor  # (B, T - 1) bool: position j - 1 predicts completion token j
    behaviour_logprobs: torch.Tensor  # (B, T - 1) the engine's log-probs at the completion targets


def sample_rows(groups: list[list[Sample]], pad_id: int) -> SampleRows:
    """Every sample of every group, in order, one row each."""
    rows = [sample for group in groups for sample in group]
    width = max(len(s.prompt_token_ids) + len(s.token_ids) for s in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    completion_mask = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    behaviour = torch.zeros((len(rows), width - 1))
    for row, sample in enumerate(rows):
        ids = sample.prompt_token_ids + sample.token_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        first = len(sample.prompt_token_ids) - 1  # position j - 1 predicts token j
        completion_mask[row, first : first + len(sample.token_ids)] = True
        behaviour[row, first : first + len(sample.token_ids)] = torch.tensor(sample.logprobs)
    return SampleRows(input_ids, attention_mask, completion_mask, behaviour)
