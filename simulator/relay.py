"""Weight broadcast time per worker for a pipelined relay tree (docs/design.md#the-weight-path), in closed form.

Workers are ranked active first, then by bandwidth (fastest first), and fill a tree: `num_seeds`
children of the learner, `fanout` children under every worker. With pipelining a node receives at the
slowest rate on its path, where a parent with f children gives each 1/f of its uplink:
    rate(n)    = min over the path of min(uplink(parent) / children(parent), downlink(child))
    arrive(n)  = payload / rate(n) + sum over the path of (chunk / rate of that hop + latency)
The second term is the pipeline's fill time: each hop forwards a chunk only once it has it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RelayNode:
    index: int
    bandwidth_mbps: float
    latency_s: float
    active: bool


def broadcast_offsets(
    nodes: list[RelayNode],
    *,
    payload_bytes: float,
    chunk_bytes: float,
    learner_uplink_mbps: float,
    num_seeds: int,
    fanout: int,
) -> dict[int, float]:
    """Seconds from publication to each node holding the whole version."""
    ranked = sorted(nodes, key=lambda n: (not n.active, -n.bandwidth_mbps, n.index))
    offsets: dict[int, float] = {}
    # a parent slot: (uplink share in bytes/s, rate limit on the path so far, fill time so far)
    learner_share = learner_uplink_mbps * 1e6 / 8 / max(1, min(num_seeds, len(ranked)))
    slots: deque[tuple[float, float, float]] = deque([(learner_share, float("inf"), 0.0)] * num_seeds)
    for node in ranked:
        share, path_rate, path_fill_s = slots.popleft()
        link = node.bandwidth_mbps * 1e6 / 8  # bytes/s, its downlink and uplink
        rate = min(path_rate, share, link)
        fill_s = path_fill_s + chunk_bytes / min(share, link) + node.latency_s
        offsets[node.index] = payload_bytes / rate + fill_s
        slots.extend([(link / fanout, rate, fill_s)] * fanout)
    return offsets
