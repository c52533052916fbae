"""Which workers the work accounting flags, and why: two comparisons of a worker with the rest of its fleet,
which leases from the same task feed (so every worker faces the same task mix).

    completion   over at least MIN_DECIDED_LEASES judged leases (answered with a group the reward service
                 scored or refused, failed, or expired), it completed less than COMPLETION_FLOOR times the
                 fleet's median completion ratio: one that leases and lets its tasks expire (or fails them, or
                 answers garbage the reward service refuses) stands out against honest peers on the same
                 tasks. An answer counts as completed only once it is scored. Judged on the leases ended since
                 an admin last released the worker, so a release is a fresh start. The same comparison judges
                 a join credential's record, all its identities together, against the fleet's median
                 identity (services/coordinator/credential_record.py): fresh identities inherit it. The coordinator
                 quarantines these by policy ([work] quarantine_incomplete; control.py).
    reward       its mean group reward departs from the rest of the fleet's by more than `num_standard_errors`
                 standard errors (Welch: each side's variance of group means over its number of groups), with
                 at least `min_groups` groups of its own and two other workers with as many; the most extreme
                 is flagged first and left out of the rest's comparisons. A signal for an operator, never
                 acted on: an honest worker that joined late in a run whose reward rose, or that samples from
                 older weights than its peers, departs too (docs/threat_model.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from shared.work_api import RewardStats, WorkCounts
from shared.work_counts import COUNTERS, JUDGED

MIN_DECIDED_LEASES = 20
COMPLETION_FLOOR = 0.5
REWARD_FLAG_STANDARD_ERRORS = 5.0  # a worker whose mean group reward departs from the rest by more is flagged
REWARD_FLAG_MIN_GROUPS = 50  # scored groups a worker (and the rest of the fleet) needs before it is compared


def completion_outliers(workers: dict[str, WorkCounts]) -> dict[str, str]:
    """Worker id -> why it is flagged: its completion ratio under COMPLETION_FLOOR x the fleet's median (the
    median of the workers with at least MIN_DECIDED_LEASES judged leases, itself included)."""
    median = fleet_median_completion(workers)
    if median is None:
        return {}
    return outliers_against(workers, median)


def fleet_median_completion(workers: dict[str, WorkCounts]) -> float | None:
    """The median completion ratio of the workers with at least MIN_DECIDED_LEASES judged leases; None with fewer
    than two of them (a fleet of one has no peers to depart from)."""
    ratios = [
        ratio
        for c in workers.values()
        if c.num_judged >= MIN_DECIDED_LEASES and (ratio := c.completion_ratio) is not None
    ]
    return statistics.median(ratios) if len(ratios) >= 2 else None


def outliers_against(records: dict[str, WorkCounts], median: float) -> dict[str, str]:
    """Id -> why: the records (a worker's, or a credential's) with at least MIN_DECIDED_LEASES judged leases whose
    completion ratio is under COMPLETION_FLOOR x `median`."""
    return {
        record_id: (
            f"completion ratio {ratio:.2f} < {COMPLETION_FLOOR} x the fleet's median {median:.2f} "
            f"({counts.scored} scored of {counts.num_judged} leases judged: {counts.rejected} answers refused by the "
            f"reward service, {counts.expired} expired, {counts.failed} failed)"
        )
        for record_id, counts in records.items()
        if counts.num_judged >= MIN_DECIDED_LEASES
        and (ratio := counts.completion_ratio) is not None
        and ratio < COMPLETION_FLOOR * median
    }


def since_release(counts: WorkCounts, baseline: WorkCounts | None) -> WorkCounts:
    """The leases that ended after the baseline (the counts when an admin last released the worker); `held`
    is as it is now. No baseline: all of them."""
    if baseline is None:
        return counts
    return counts.model_copy(
        update={name: max(0, getattr(counts, name) - getattr(baseline, name)) for name in (*COUNTERS, *JUDGED)}
    )


def reward_outliers(
    rewards: dict[str, RewardStats],
    *,
    num_standard_errors: float = REWARD_FLAG_STANDARD_ERRORS,
    min_groups: int = REWARD_FLAG_MIN_GROUPS,
) -> dict[str, str]:
    """Worker id -> why its mean group reward departs from the rest of the fleet's (module docstring). The rest
    are pooled from their sums. The most extreme worker past the bound is flagged and left out of the others'
    comparisons, then the next, so one outlier does not drag honest workers past the bound with it. A worker
    is compared only with at least two others of `min_groups` groups: against one, either could be the odd one."""
    min_groups = max(2, min_groups)  # a variance needs two
    pool = dict(rewards)
    flagged: dict[str, str] = {}
    while True:
        total = _pooled(pool.values())
        num_judged = sum(stats.num_groups >= min_groups for stats in pool.values())
        departures: dict[str, tuple[float, RewardStats]] = {}  # worker id -> (z, the rest of the pool)
        for worker_id, own in pool.items():
            if own.num_groups >= min_groups and num_judged - 1 >= 2:
                rest = RewardStats(
                    num_groups=total.num_groups - own.num_groups,
                    reward_sum=total.reward_sum - own.reward_sum,
                    reward_sum_sq=max(0.0, total.reward_sum_sq - own.reward_sum_sq),
                )
                departures[worker_id] = (_welch_z(own, rest), rest)
        if not departures:
            return flagged
        worker_id, (z, rest) = max(departures.items(), key=lambda item: abs(item[1][0]))
        if not abs(z) > num_standard_errors:
            return flagged
        own = pool.pop(worker_id)
        flagged[worker_id] = (
            f"mean group reward {own.mean:.3f} over {own.num_groups} groups, the rest of the fleet's "
            f"{rest.mean:.3f} over {rest.num_groups}: {abs(z):.1f} standard errors "
            f"{'above' if z > 0 else 'below'} (flagged past {num_standard_errors:g})"
        )


def _pooled(stats: Iterable[RewardStats]) -> RewardStats:
    stats = list(stats)
    return RewardStats(
        num_groups=sum(r.num_groups for r in stats),
        reward_sum=sum(r.reward_sum for r in stats),
        reward_sum_sq=sum(r.reward_sum_sq for r in stats),
    )


def _welch_z(own: RewardStats, rest: RewardStats) -> float:
    """(own mean - rest mean) / its standard error; +-inf when both sides are constant and differ."""
    assert own.mean is not None and rest.mean is not None  # callers require min_groups >= 2 on both sides
    assert own.variance is not None and rest.variance is not None
    difference = own.mean - rest.mean
    standard_error = math.sqrt(own.variance / own.num_groups + rest.variance / rest.num_groups)
    if standard_error > 0:
        return difference / standard_error
    # both sides constant: any difference beyond float rounding is certain
    return 0.0 if abs(difference) < 1e-9 else math.copysign(math.inf, difference)
