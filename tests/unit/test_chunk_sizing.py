"""The chunk-size rule (shared/weight_channel/chunk_sizing.py): long enough on the link for per-chunk costs to vanish,
short enough that one bad chunk refetched down the chain costs a small fraction of the transfer."""

from __future__ import annotations

import pytest

from shared.weight_channel.chunk_sizing import (
    BAD_CHUNK_FRACTION,
    MAX_CHUNK_SIZE_BYTES,
    MAX_NUM_CHUNKS,
    MIN_CHUNK_SIZE_BYTES,
    MIN_CHUNK_TIME_S,
    pick_chunk_size_bytes,
)

KIB, MIB = 1024, 1024 * 1024
QWEN3_0_6B_BYTES = 1_192_000_000  # bf16 safetensors


def chunk_time_s(chunk_size_bytes: int, link_mbps: float) -> float:
    return chunk_size_bytes * 8 / (link_mbps * 1e6)


@pytest.mark.parametrize(
    ("total_size_bytes", "link_mbps", "depth", "expected_bytes"),
    [
        (256 * MIB, 200, 16, 512 * KIB),  # the broadcast benchmark
        (QWEN3_0_6B_BYTES, 200, 16, 512 * KIB),  # configs/qwen3.toml's model on the benchmark's links
        (QWEN3_0_6B_BYTES, 1000, 16, 2 * MIB),  # a fast link: the bad-chunk cap (3.7 MB) wins over 4 MiB
        (256 * MIB, 1000, 1, 4 * MIB),  # one hop: only the link rate matters
        (16 * MIB, 200, 64, MIN_CHUNK_SIZE_BYTES),  # tiny and deep: clamped from below
    ],
)
def test_the_rule_on_known_deployments(
    total_size_bytes: int, link_mbps: float, depth: int, expected_bytes: int
) -> None:
    assert pick_chunk_size_bytes(total_size_bytes, link_mbps, depth) == expected_bytes


@pytest.mark.parametrize("link_mbps", [50, 200, 1000, 10_000])
@pytest.mark.parametrize("depth", [1, 4, 16, 64])
def test_a_chunk_is_a_power_of_two_within_bounds_and_a_bad_one_costs_a_small_fraction(
    link_mbps: float, depth: int
) -> None:
    total_size_bytes = 4 * 1024 * MIB
    chunk_size_bytes = pick_chunk_size_bytes(total_size_bytes, link_mbps, depth)
    assert chunk_size_bytes & (chunk_size_bytes - 1) == 0
    assert MIN_CHUNK_SIZE_BYTES <= chunk_size_bytes <= MAX_CHUNK_SIZE_BYTES
    # one bad chunk, fetched again whole by every receiver below: at most the fraction of one transfer
    transfer_s = chunk_time_s(total_size_bytes, link_mbps)
    assert depth * chunk_time_s(chunk_size_bytes, link_mbps) <= BAD_CHUNK_FRACTION * transfer_s
    # and no more than twice the chunk that just lasts MIN_CHUNK_TIME_S (power-of-two rounding)
    assert chunk_time_s(chunk_size_bytes, link_mbps) < 2 * MIN_CHUNK_TIME_S


def test_a_faster_link_never_gets_smaller_chunks_and_a_deeper_chain_never_bigger() -> None:
    sizes_by_rate = [pick_chunk_size_bytes(QWEN3_0_6B_BYTES, mbps, 4) for mbps in (10, 100, 200, 1000, 10_000)]
    assert sizes_by_rate == sorted(sizes_by_rate)
    sizes_by_depth = [pick_chunk_size_bytes(QWEN3_0_6B_BYTES, 10_000, depth) for depth in (1, 2, 8, 32, 128)]
    assert sizes_by_depth == sorted(sizes_by_depth, reverse=True)


def test_the_manifest_stays_bounded_for_huge_versions() -> None:
    total_size_bytes = 140 * 1024 * MIB  # a 70B model in bf16, on a slow deep chain
    chunk_size_bytes = pick_chunk_size_bytes(total_size_bytes, 50, 256)
    assert -(-total_size_bytes // chunk_size_bytes) <= MAX_NUM_CHUNKS


@pytest.mark.parametrize(("size", "mbps", "depth"), [(0, 200, 1), (1, 0, 1), (1, 200, 0)])
def test_nonsense_inputs_are_refused(size: int, mbps: float, depth: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        pick_chunk_size_bytes(size, mbps, depth)
