"""The work accounting as the coordinator reads it (GET /v1/work/accounting, and each control pass): the
work API's counters per worker and in total (shared/work_counts.py, written by services/coordinator/work_leases.py),
the leases held now (XPENDING), what the reward service recorded per worker (shared/worker_rewards.py), and
the workers they flag (services/coordinator/work_flags.py). Eval tasks are counted apart (shared/work_counts.py
EvalCounter, in the same hashes) and reported apart (`eval_workers`, `eval_totals`): no figure above includes them.

A worker's completion is judged on the leases ended since an admin last released it: the release stores
its counters as a baseline (RunKeys.work_release_baseline), so a released worker starts afresh instead of
being quarantined again for what it did before. The counters themselves are never reset: the run's
accounting closes from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import redis
from redis.typing import EncodableT

from services.coordinator.work_flags import completion_outliers, reward_outliers, since_release
from shared import worker_rewards
from shared.bus import redis_text
from shared.config import WorkConfig
from shared.keys import RunKeys
from shared.streams import TASKS
from shared.work_api import EvalWorkCounts, RewardStats, WorkAccounting, WorkCounts
from shared.work_counts import EvalCounter, WorkCounter


class WorkBooks:
    """Reads of the work accounting for one run; `lease_s` is reported with it."""

    def __init__(self, client: redis.Redis, keys: RunKeys, config: WorkConfig, *, lease_s: float) -> None:
        self.redis = client
        self.keys = keys
        self.config = config
        self.lease_s = lease_s
        self.tasks = keys.name_of(TASKS)
        self.group = cast(str, TASKS.group)

    def accounting(self) -> WorkAccounting:
        worker_ids = sorted(redis_text(worker_id) for worker_id in self.redis.smembers(self.keys.work_worker_ids))
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hgetall(self.keys.work_counts(worker_id))
            pipe.hgetall(self.keys.work_totals)
            counts = pipe.execute()
        held = self._held_by_consumer()
        rewards = self.rewards(worker_ids)
        workers = {
            worker_id: _counts(raw, held.get(worker_id, 0), rewards[worker_id])
            for worker_id, raw in zip(worker_ids, counts, strict=False)
        }
        totals = _counts(counts[-1], sum(held.values()), _pooled_judged(rewards.values()))
        return WorkAccounting(
            lease_s=self.lease_s,
            max_held=self.config.max_held_tasks,
            workers=workers,
            totals=totals,
            flagged=completion_outliers(self._since_release(workers)),
            rewards={worker_id: stats for worker_id, stats in rewards.items() if stats.num_groups},
            reward_flagged=reward_outliers(
                rewards,
                num_standard_errors=self.config.reward_flag_standard_errors,
                min_groups=self.config.reward_flag_min_groups,
            ),
            eval_workers={
                worker_id: evals
                for worker_id, raw in zip(worker_ids, counts, strict=False)
                if (evals := _eval_counts(raw)).leased
            },
            eval_totals=_eval_counts(counts[-1]),
        )

    def counts_since_release(self, worker_ids: Iterable[str]) -> dict[str, WorkCounts]:
        """Each worker's counters over the leases ended since an admin last released it (`held`: 0, not read),
        with its groups the reward service scored and refused; what the completion flag judges."""
        worker_ids = list(worker_ids)
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hgetall(self.keys.work_counts(worker_id))
            counts = pipe.execute()
        rewards = self.rewards(worker_ids)
        return self._since_release(
            {wid: _counts(raw, 0, rewards[wid]) for wid, raw in zip(worker_ids, counts, strict=True)}
        )

    def rewards(self, worker_ids: Iterable[str]) -> dict[str, RewardStats]:
        """What the reward service recorded for each worker (shared/worker_rewards.py; none: zeros)."""
        worker_ids = list(worker_ids)
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hgetall(self.keys.worker_rewards(worker_id))
            raws = pipe.execute()
        return {worker_id: worker_rewards.parse(raw) for worker_id, raw in zip(worker_ids, raws, strict=True)}

    def mark_released(self, worker_id: str) -> None:
        """An admin released the worker: its completion is judged from now on (the counters stay as they are)."""
        raw: dict[bytes, bytes] = self.redis.hgetall(self.keys.work_counts(worker_id))  # type: ignore[assignment]
        now = _counts(raw, 0, self.rewards([worker_id])[worker_id])
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
            worker_id: since_release(counts, _counts(raw, 0, None) if raw else None)
            for (worker_id, counts), raw in zip(workers.items(), baselines, strict=True)
        }

    def _held_by_consumer(self) -> dict[str, int]:
        try:
            summary = self.redis.xpending(self.tasks, self.group)
        except redis.ResponseError:  # no stream or group yet: nothing held
            return {}
        return {redis_text(c["name"]): int(c["pending"]) for c in summary.get("consumers") or []}


JUDGED_FIELDS = ("scored", "rejected")  # a release baseline stores them with the counters


def _counts(raw: dict[bytes, bytes], held: int, judged: RewardStats | None) -> WorkCounts:
    """The counters of a hash (a worker's, or a release baseline, which carries `scored` and `rejected` too), the
    leases `held` now, and what the reward service judged (`judged`: None for a baseline)."""
    known = {counter.value for counter in WorkCounter} | ({*JUDGED_FIELDS} if judged is None else set())
    values = {redis_text(name): max(int(value), 0) for name, value in raw.items() if redis_text(name) in known}
    if judged is not None:
        values |= {"scored": judged.num_groups, "rejected": judged.num_rejected}
    return WorkCounts(**values, held=held)


def _eval_counts(raw: dict[bytes, bytes]) -> EvalWorkCounts:
    """The eval-task counters of a worker's (or the totals') hash."""
    values = {counter.name.lower(): max(int(raw.get(counter.value.encode(), 0)), 0) for counter in EvalCounter}
    return EvalWorkCounts(**values)


def _pooled_judged(stats: Iterable[RewardStats]) -> RewardStats:
    stats = list(stats)
    return RewardStats(num_groups=sum(s.num_groups for s in stats), num_rejected=sum(s.num_rejected for s in stats))
