"""How a batch's rows are dealt to the learner's ranks (distributed.RankGroup, the sharded step's
data_parallel.DataParallel): every row to exactly one rank, in order, balanced, and every rank padded to the same
count so that all of them run the same number of micro-batches (a rank with one fewer would leave the
others waiting in a collective)."""

from __future__ import annotations

import pytest
import torch

from services.learner.data_parallel import ONE_PROCESS
from services.learner.distributed import RankGroup
from services.learner.trainer import micro_batches, share_rows
from tests.sharded_step import GROUP_SIZES, fixed_batch


@pytest.mark.parametrize(("num_rows", "world_size"), [(7, 2), (8, 2), (5, 4), (2, 4), (1, 3), (64, 8)])
def test_every_row_goes_to_one_rank_in_order_and_every_rank_gets_the_same_count(num_rows: int, world_size: int) -> None:
    shares = [RankGroup(rank=rank, world_size=world_size).share(num_rows) for rank in range(world_size)]
    real = torch.cat([indices[:num_real] for indices, num_real in shares])
    assert real.tolist() == list(range(num_rows))
    assert len({len(indices) for indices, _ in shares}) == 1  # padded to one size
    assert len(shares[0][0]) == max(1, -(-num_rows // world_size))
    assert max(num_real for _, num_real in shares) - min(num_real for _, num_real in shares) <= 1


def test_one_process_takes_every_row_without_padding() -> None:
    indices, num_real = ONE_PROCESS.share(7)
    assert indices.tolist() == list(range(7)) and num_real == 7
    batch = fixed_batch(vocab_size=20, seed=0)
    assert share_rows(batch, ONE_PROCESS).batch is batch  # no copy


def test_padding_rows_weigh_nothing_and_keep_the_micro_batch_counts_equal() -> None:
    batch = fixed_batch(vocab_size=20, seed=0)  # 7 rows over 2 ranks: 4 and 3 + 1 padding row
    first, second = (share_rows(batch, RankGroup(rank=rank, world_size=2)) for rank in (0, 1))
    assert (first.num_real, second.num_real) == (4, 3) and sum(GROUP_SIZES) == batch.num_samples
    assert first.batch.num_samples == second.batch.num_samples == 4
    assert not second.batch.completion_mask[3].any()  # the padding row has no token to train
    assert torch.equal(second.batch.input_ids[:3], batch.input_ids[4:])
    assert batch.completion_mask[0].any()  # the batch it was copied from is untouched
    assert len(micro_batches(first.batch.num_samples, 3)) == len(micro_batches(second.batch.num_samples, 3))
