"""The chunk-size rule: `[broadcast] chunk_size_bytes` from the version's size, the link rate and the
relay depth (docs/weight_path.md, "Chunk size").

A relay forwards cut-through (server.py): a hop costs one piece of the stream
(`RELAY_PIECE_BYTES`, 128 KiB), not one chunk, so on a healthy chain the chunk size no longer sets
the pipeline fill. What it still sets:

- per-chunk fixed costs (a hash call, a verdict byte, the store's bookkeeping, a fraction of a ms in
  Python): a chunk should last at least `MIN_CHUNK_TIME_S` on the link so they stay a few per cent.
  That is a lower bound that grows with the link rate.
- what one bad chunk costs: a chunk that fails verification is fetched again whole, store-and-forward,
  by every receiver below the holder that sent it: up to depth x chunk time. Keeping that below
  `BAD_CHUNK_FRACTION` of the version's transfer is an upper bound, chunk <= fraction x size / depth
  (the link rate cancels). It is also exactly the bound a store-and-forward relay would need for its
  pipeline fill.
- the manifest: 64 hex characters per chunk, fetched and verified by every receiver, so at most
  `MAX_NUM_CHUNKS` chunks.

The rule: the smallest power of two that lasts `MIN_CHUNK_TIME_S` on the link, lowered to the
upper bound where they conflict (robustness before overhead), raised to keep the manifest bounded,
within [`MIN_CHUNK_SIZE_BYTES`, `MAX_CHUNK_SIZE_BYTES`].

    python -m shared.weight_channel.chunk_sizing --size-bytes 1200000000 --link-mbps 200 --depth 16
"""

from __future__ import annotations

import argparse

MIN_CHUNK_TIME_S = 0.02  # a chunk on the link: per-chunk costs of ~0.3 ms stay under 2%
BAD_CHUNK_FRACTION = 0.05  # one bad chunk refetched down the whole chain: at most 5% of the transfer
MAX_NUM_CHUNKS = 65536  # a manifest of ~4.5 MB of hex digests
MIN_CHUNK_SIZE_BYTES = 64 * 1024
MAX_CHUNK_SIZE_BYTES = 64 * 1024 * 1024


def pick_chunk_size_bytes(total_size_bytes: int, link_mbps: float, expected_depth: int) -> int:
    """The chunk size for a version of `total_size_bytes` relayed down chains of `expected_depth` hops
    (a chain of N receivers: N; a tree of fanout F: about log_F N) over links of `link_mbps` Mbit/s
    (the slowest one that matters: a worker's downlink). A power of two. Raises ValueError for
    non-positive inputs."""
    if total_size_bytes < 1 or link_mbps <= 0 or expected_depth < 1:
        raise ValueError(
            f"need a positive size, link rate and depth, got {total_size_bytes} bytes, {link_mbps} Mbit/s, "
            f"depth {expected_depth}"
        )
    link_bytes_per_s = link_mbps * 1e6 / 8
    overhead_floor_bytes = _power_of_two_at_least(link_bytes_per_s * MIN_CHUNK_TIME_S)
    bad_chunk_cap_bytes = _power_of_two_at_most(BAD_CHUNK_FRACTION * total_size_bytes / expected_depth)
    manifest_floor_bytes = _power_of_two_at_least(total_size_bytes / MAX_NUM_CHUNKS)
    chunk_size_bytes = max(min(overhead_floor_bytes, bad_chunk_cap_bytes), manifest_floor_bytes)
    return min(max(chunk_size_bytes, MIN_CHUNK_SIZE_BYTES), MAX_CHUNK_SIZE_BYTES)


def _power_of_two_at_least(num_bytes: float) -> int:
    size = 1
    while size < num_bytes:
        size *= 2
    return size


def _power_of_two_at_most(num_bytes: float) -> int:
    size = 1
    while size * 2 <= num_bytes:
        size *= 2
    return size


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m shared.weight_channel.chunk_sizing", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size-bytes", type=int, required=True, help="one full version (the safetensors file)")
    parser.add_argument("--link-mbps", type=float, required=True, help="a worker's downlink, Mbit/s")
    parser.add_argument("--depth", type=int, required=True, help="expected relay depth (a chain of N: N)")
    args = parser.parse_args()
    print(pick_chunk_size_bytes(args.size_bytes, args.link_mbps, args.depth))


if __name__ == "__main__":
    main()
