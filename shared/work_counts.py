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
"""

from __future__ import annotations

from enum import StrEnum


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
