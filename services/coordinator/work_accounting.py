"""The work accounting as the coordinator reads it (GET /v1/work/accounting, and each control pass): the
work API's counters per worker and in total (written by services/coordinator/work_leases.py), the leases held now
(XPENDING) and what the reward service recorded per worker (shared/worker_rewards.py), all read by
shared/work_counts.py read_work_counts as the accounting CLI reads them, and the workers they flag
(services/coordinator/work_flags.py). Eval tasks are counted apart (shared/work_counts.py
EvalCounter, in the same hashes) and reported apart (`eval_workers`, `eval_totals`): no figure above includes them.

A worker's completion is judged on the leases ended since an admin last released it: the release stores
its counters as a baseline (RunKeys.work_release_baseline), so a released worker starts afresh instead of
being quarantined again for what it did before. The counters themselves are never reset: the run's
accounting closes from them.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis
from redis.typing import EncodableT

from services.coordinator.work_flags import completion_outliers, reward_outliers, since_release
from shared import worker_rewards
from shared.config import WorkConfig
from shared.keys import RunKeys
from shared.work_api import RewardStats, WorkAccounting, WorkCounts
from shared.work_counts import read_work_counts, release_baseline


class WorkBooks:
    """Reads of the work accounting for one run; `lease_s` is reported with it."""

    def __init__(self, client: redis.Redis, keys: RunKeys, config: WorkConfig, *, lease_s: float) -> None:
        self.redis = client
        self.keys = keys
        self.config = config
        self.lease_s = lease_s

    def accounting(self) -> WorkAccounting:
        tally = read_work_counts(self.redis, self.keys)
        return WorkAccounting(
            lease_s=self.lease_s,
            max_held=self.config.max_held_tasks,
            workers=tally.workers,
            totals=tally.totals,
            flagged=completion_outliers(self._since_release(tally.workers)),
            rewards={worker_id: stats for worker_id, stats in tally.rewards.items() if stats.num_groups},
            reward_flagged=reward_outliers(tally.rewards),
            eval_workers={worker_id: evals for worker_id, evals in tally.eval_workers.items() if evals.leased},
            eval_totals=tally.eval_totals,
        )

    def counts_since_release(self, worker_ids: Iterable[str]) -> dict[str, WorkCounts]:
        """Each worker's counters over the leases ended since an admin last released it (`held`: 0, not read),
        with its groups the reward service scored and refused; what the completion flag judges."""
        return self._since_release(read_work_counts(self.redis, self.keys, worker_ids, held=False).workers)

    def rewards(self, worker_ids: Iterable[str]) -> dict[str, RewardStats]:
        """What the reward service recorded for each worker (shared/worker_rewards.py; none: zeros)."""
        return worker_rewards.read(self.redis, self.keys, worker_ids)

    def mark_released(self, worker_id: str) -> None:
        """An admin released the worker: its completion is judged from now on (the counters stay as they are)."""
        now = read_work_counts(self.redis, self.keys, [worker_id], held=False).workers[worker_id]
        counts: dict[EncodableT, EncodableT] = {name: value for name, value in now.model_dump().items() if value}
        baseline = self.keys.work_release_baseline(worker_id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(baseline)
            if counts:
                pipe.hset(baseline, mapping=counts)
            pipe.execute()

    def _since_release(self, workers: dict[str, WorkCounts]) -> dict[str, WorkCounts]:
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in workers:
                pipe.hgetall(self.keys.work_release_baseline(worker_id))
            baselines = pipe.execute()
        return {
            worker_id: since_release(counts, release_baseline(raw, self.keys.work_release_baseline(worker_id)))
            for (worker_id, counts), raw in zip(workers.items(), baselines, strict=True)
        }
