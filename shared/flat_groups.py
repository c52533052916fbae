"""A "flat" group: every sample got the same reward, so its GRPO advantages are all 0 and it adds nothing to
the gradient. The learner skips such groups under `[grpo] dynamic_sampling` (services/learner/batch.py) and
the reward service's task feed widens its window by the share it sees (services/reward/task_feed.py)."""

from __future__ import annotations

# Rewards this close count as equal: a group mean of identical floats can differ from them in the last bit.
FLAT_TOLERANCE = 1e-6


def is_flat(rewards: list[float]) -> bool:
    """True when every sample of the group got the same reward (its advantages are all 0)."""
    return max(rewards) - min(rewards) <= FLAT_TOLERANCE
