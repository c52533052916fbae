"""What the reward service records per worker about the rewards of the groups it scored, for the coordinator's
work accounting (services/coordinator/work_flags.py reward_outliers, the ledger's verified work).

Producer: the reward service (services/reward/service.py), in the same transaction as the scored groups and
their acks, so each scored group counts exactly once. Consumer: the coordinator. One hash per worker
(RunKeys.worker_rewards), fields:

    num_groups      groups of the worker scored (the ledger's "verified work": they passed the producer check,
                    the token checks and the verifier)
    reward_sum      sum over those groups of the group's mean reward
    reward_sum_sq   sum of its squares
    num_rejected    groups of the worker it dead-lettered instead (unscorable, forged: `rejected_tally`, written
                    with the dead letter and its ack): with num_groups, what the work API's completion ratio and
                    the lease allowance judge (an answer counts as completed only once it is scored)

The unit is the group, not the sample: a group's samples share a prompt, so they are not independent draws,
while groups are (every worker leases from the same task feed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import redis

from shared.keys import RunKeys
from shared.messages import ScoredGroup
from shared.work_api import RewardStats

NUM_GROUPS = "num_groups"
REWARD_SUM = "reward_sum"
REWARD_SUM_SQ = "reward_sum_sq"
NUM_REJECTED = "num_rejected"

Increment = tuple[str, str, float]  # (hash key, field, amount): one HINCRBYFLOAT
MAX_STORED = 1e15  # a stored sum or count past this is not one the reward service wrote: read as 0


def increments(keys: RunKeys, scored: Sequence[ScoredGroup]) -> list[Increment]:
    """The HINCRBYFLOATs that record `scored` (several groups of one worker add up first)."""
    sums: dict[str, tuple[float, float, float]] = {}
    for group in scored:
        mean = sum(group.rewards) / len(group.rewards)
        if not math.isfinite(mean):  # the verifier pool refuses non-finite rewards; never poison a sum
            continue
        count, total, squares = sums.get(group.rollout.worker_id, (0.0, 0.0, 0.0))
        sums[group.rollout.worker_id] = (count + 1, total + mean, squares + mean * mean)
    return [
        (keys.worker_rewards(worker_id), field, amount)
        for worker_id, worker_sums in sums.items()
        for field, amount in zip((NUM_GROUPS, REWARD_SUM, REWARD_SUM_SQ), worker_sums, strict=True)
    ]


def rejected_tally(keys: RunKeys, worker_id: str) -> tuple[str, str]:
    """The (hash key, field) a dead-lettered group of `worker_id` is counted in (StreamBus.dead_letter's tally)."""
    return keys.worker_rewards(worker_id), NUM_REJECTED


def read(client: redis.Redis, keys: RunKeys, worker_ids: Iterable[str]) -> dict[str, RewardStats]:
    """What the reward service recorded for each worker (none: zeros), in one round trip."""
    worker_ids = list(worker_ids)
    with client.pipeline(transaction=False) as pipe:
        for worker_id in worker_ids:
            pipe.hgetall(keys.worker_rewards(worker_id))
        raws = pipe.execute()
    return {worker_id: parse(raw) for worker_id, raw in zip(worker_ids, raws, strict=True)}


def parse(raw: Mapping[bytes, bytes]) -> RewardStats:
    """A stored hash as RewardStats; a missing, unparsable or absurd field reads as 0 (nothing scored)."""
    values = {}
    for field in (NUM_GROUPS, REWARD_SUM, REWARD_SUM_SQ, NUM_REJECTED):
        try:
            value = float(raw.get(field.encode(), b"0"))
        except ValueError:
            value = 0.0
        values[field] = value if math.isfinite(value) and abs(value) <= MAX_STORED else 0.0
    return RewardStats(
        num_groups=max(0, int(values[NUM_GROUPS])),
        reward_sum=values[REWARD_SUM],
        reward_sum_sq=max(0.0, values[REWARD_SUM_SQ]),
        num_rejected=max(0, int(values[NUM_REJECTED])),
    )
