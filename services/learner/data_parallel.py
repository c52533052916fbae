"""What a learner step needs to know about how it runs (trainer.py): the policy's log-prob forward, and the
ranks its rows are dealt to. One process: ONE_PROCESS; sharded over G ranks: distributed.RankGroup."""

from __future__ import annotations

from typing import Protocol

import torch


class LogprobsForward(Protocol):
    """The policy's log-prob forward: grpo.token_logprobs on its model (input_ids, attention_mask (B, T);
    temperatures (B,)) -> (B, T - 1) float32 log-probs of each next token."""

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperatures: torch.Tensor, chunk_tokens: int = 0
    ) -> torch.Tensor: ...


class DataParallel(Protocol):
    """The ranks a step runs on, as the step sees them (distributed.RankGroup when the policy is sharded).
    Every rank runs the same step on the same batch and makes these calls at the same points: sharded,
    `gather_rows` and `sum` are collectives."""

    @property
    def gradient_scale(self) -> int:
        """The factor on each rank's loss before backward that makes the ranks' gradients add up."""

    def share(self, num_rows: int) -> tuple[torch.Tensor, int]:
        """This rank's rows of [0, num_rows) in order: (indices (m,), the number of real rows; the rest
        pad every rank to the same m)."""

    def gather_rows(self, local: torch.Tensor, num_real: int, num_rows: int) -> torch.Tensor:
        """Every rank's first num_real rows of `local` (m, ...) in rank order: the (num_rows, ...) whole."""

    def sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks."""


class OneProcess:
    """The step on one process: every row is this process's, nothing to gather or sum."""

    @property
    def gradient_scale(self) -> int:
        return 1

    def share(self, num_rows: int) -> tuple[torch.Tensor, int]:
        return torch.arange(num_rows), num_rows

    def gather_rows(self, local: torch.Tensor, num_real: int, num_rows: int) -> torch.Tensor:
        return local[:num_real]

    def sum(self, *values: float) -> list[float]:
        return list(values)


ONE_PROCESS = OneProcess()
