"""What the work API counts per worker and in total (RunKeys.work_counts / work_totals): the run's task
accounting starts here, from what the coordinator saw arrive, never from what a worker says.

    leased     tasks handed to the worker (a reissued task counts again for its new holder)
    returned   groups it submitted for a lease it held (before any check of their content)
    accepted   of those, groups that passed the work API's checks and went on to `rollouts`
    refused    groups submitted for a lease it did not hold, already answered, or malformed (dead-lettered)
    expired    leases it held past the lease time without answering: the task went to another worker
    failed     tasks it reported it could not serve (engine error): dead-lettered

Per worker: leased = accepted + failed + expired + (leases it still holds). `refused` counts answers,
not tasks: a refused answer leaves its lease as it was.

Eval tasks (held-out evaluation by the workers, docs/evaluation.md#where-evaluation-runs) are counted apart, in
the same hashes under EvalCounter's names, so they change none of the counts above nor the run's accounting:
eval_leased, eval_accepted, eval_refused, eval_expired (taken over by another worker at that version after the
lease time) and eval_given_back (handed back without penalty: the worker's version moved on, or its engine
could not serve the prompt). An eval lease never dead-letters anything nor cuts an allowance.

The typed record of a worker's (or the run's) counts is WorkCounts (shared/api.py): these counters by their names
here, the leases it holds now, and what the reward service made of its accepted groups (JUDGED). Redis holds them
as above; `read_work_counts` is the one reader, for the coordinator's work accounting
(services/coordinator/work_accounting.py) and the accounting CLI (cluster/accounting.py) alike.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

import redis

from shared import worker_rewards
from shared.api import WorkCounts
from shared.bus import redis_text
from shared.keys import RunKeys
from shared.streams import TASKS
from shared.work_api import EvalWorkCounts, RewardStats


class WorkCounter(StrEnum):
    LEASED = "leased"
    RETURNED = "returned"
    ACCEPTED = "accepted"
    REFUSED = "refused"
    EXPIRED = "expired"
    FAILED = "failed"


class EvalCounter(StrEnum):
    LEASED = "eval_leased"
    ACCEPTED = "eval_accepted"
    REFUSED = "eval_refused"
    EXPIRED = "eval_expired"
    GIVEN_BACK = "eval_given_back"


COUNTERS = tuple(counter.value for counter in WorkCounter)  # WorkCounts' fields a work hash holds
EVAL_COUNTERS = tuple(counter.value for counter in EvalCounter)
# WorkCounts' fields from the reward service's record of the worker (shared/worker_rewards.py): of its accepted
# groups, those scored and those dead-lettered. A release baseline stores them with the counters.
JUDGED = ("scored", "rejected")


@dataclass(frozen=True)
class WorkTally:
    """The work API's counters as Redis holds them now (read_work_counts)."""

    workers: dict[str, WorkCounts]  # by worker id
    totals: WorkCounts  # over every worker of the run
    rewards: dict[str, RewardStats]  # by worker id: what the reward service recorded of its groups
    eval_workers: dict[str, EvalWorkCounts]  # by worker id: its eval-task counters
    eval_totals: EvalWorkCounts
    problems: list[str]  # stored counters that are not counts: each read as 0


def read_work_counts(
    client: redis.Redis, keys: RunKeys, worker_ids: Iterable[str] | None = None, *, held: bool = True
) -> WorkTally:
    """The counts of `worker_ids` (None: every worker that ever leased a task, RunKeys.work_worker_ids) and of the
    run: each one's counters, its groups the reward service scored and rejected and, with `held`, the leases it
    holds now (its pending entries of `tasks`; without, 0 and not read)."""
    if worker_ids is None:
        ids = sorted(redis_text(w, errors="replace") for w in client.smembers(keys.work_worker_ids))
    else:
        ids = list(dict.fromkeys(worker_ids))
    with client.pipeline(transaction=False) as pipe:
        for worker_id in ids:
            pipe.hgetall(keys.work_counts(worker_id))
        pipe.hgetall(keys.work_totals)
        *raws, totals_raw = pipe.execute()
    rewards = worker_rewards.read(client, keys, ids)
    held_by = _held_by_consumer(client, keys) if held else {}
    problems: list[str] = []
    workers = {
        worker_id: _work_counts(
            raw, keys.work_counts(worker_id), problems, held_by.get(worker_id, 0), [rewards[worker_id]]
        )
        for worker_id, raw in zip(ids, raws, strict=True)
    }
    return WorkTally(
        workers=workers,
        totals=_work_counts(totals_raw, keys.work_totals, problems, sum(held_by.values()), rewards.values()),
        rewards=rewards,
        eval_workers={
            worker_id: _eval_counts(raw, keys.work_counts(worker_id), problems)
            for worker_id, raw in zip(ids, raws, strict=True)
        },
        eval_totals=_eval_counts(totals_raw, keys.work_totals, problems),
        problems=problems,
    )


def parse_counts(
    raw: Mapping[bytes, bytes], key: str, problems: list[str] | None = None, names: Collection[str] | None = None
) -> dict[str, int]:
    """The fields `names` (None: every field) of the stored hash of counts `key`, field -> count; one that is not
    a whole number >= 0 is left out (read as 0) and named in `problems`."""
    counts: dict[str, int] = {}
    for raw_name, value in raw.items():
        name = redis_text(raw_name, errors="replace")
        if names is not None and name not in names:
            continue
        try:
            count = int(value)
        except ValueError:
            count = -1
        if count >= 0:
            counts[name] = count
        elif problems is not None:
            problems.append(f"{key} field {name!r} is not a count: {value[:40]!r}")
    return counts


def release_baseline(raw: Mapping[bytes, bytes], key: str) -> WorkCounts | None:
    """A stored release baseline (a worker's or a credential's): its counters and what the reward service had
    judged when an admin released it; None: never released."""
    return WorkCounts(**parse_counts(raw, key, names=(*COUNTERS, *JUDGED))) if raw else None


def _work_counts(
    raw: Mapping[bytes, bytes], key: str, problems: list[str], held: int, judged: Iterable[RewardStats]
) -> WorkCounts:
    """A work hash's counters, the leases `held` now, and the groups the reward service `judged` (several: pooled)."""
    judged = list(judged)
    return WorkCounts(
        **parse_counts(raw, key, problems, COUNTERS),
        held=held,
        scored=sum(stats.num_groups for stats in judged),
        rejected=sum(stats.num_rejected for stats in judged),
    )


def _eval_counts(raw: Mapping[bytes, bytes], key: str, problems: list[str]) -> EvalWorkCounts:
    counts = parse_counts(raw, key, problems, EVAL_COUNTERS)
    return EvalWorkCounts(**{counter.name.lower(): counts.get(counter.value, 0) for counter in EvalCounter})


def _held_by_consumer(client: redis.Redis, keys: RunKeys) -> dict[str, int]:
    """Pending entries of `tasks` per consumer: a consumer is a worker id, an entry one lease it holds."""
    try:
        summary = client.xpending(keys.name_of(TASKS), cast(str, TASKS.group))
    except redis.ResponseError:  # no stream or group yet: nothing held
        return {}
    return {redis_text(c["name"], errors="replace"): int(c["pending"]) for c in summary.get("consumers") or []}
