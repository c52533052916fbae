"""A rollout worker's eval tasks: held-out evaluation at exactly the version being evaluated
(docs/evaluation.md#where-evaluation-runs).

The worker names its engine's version when it leases (services/rollout/worker.py `lease_tasks`); the coordinator
then hands it that version's eval tasks first (TaskGroup.eval_version; services/coordinator/eval_leases.py). Between
that lease and their decoding no weights are loaded: batch mode decodes them (and the training tasks of the same
lease) and leases once more at that version before it syncs again (a lease carries at most 64), the
continuous loop holds its weights (and leases nothing) until its rows in flight have finished, then decodes them
(services/rollout/continuous.py). Every eval task is decoded greedily, one sample, all of them in one engine call
(one call per task after an EngineError, so a bad prompt fails alone), signed like any group and answered naming
its eval_version. A lease whose version is no longer the engine's (it cannot happen by the rule above, but a
worker never answers for weights it does not hold), or whose prompt the engine cannot serve, is handed back:
another worker at the version takes it, and nothing counts against this one.

Eval answers are not rollouts: they count in neither the worker's groups done nor its throughput.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from engines.interface import EngineError, InferenceEngine, Sampling
from services.rollout.rollout_groups import build_rollout_group
from services.rollout.work_client import WorkClient
from shared.messages import RolloutGroup
from shared.rollout_mac import sign_rollout
from shared.tokenization import PromptInput
from shared.work_api import MAX_GROUPS_PER_LEASE, LeasedTask

log = logging.getLogger(__name__)


def max_eval_groups(max_groups_per_batch: int, group_size: int) -> int:
    """Eval tasks asked for per lease: a batch's rows (an eval task is one sample), at most a lease's."""
    return min(MAX_GROUPS_PER_LEASE, max_groups_per_batch * group_size)


def split_evals(leased: Sequence[LeasedTask]) -> tuple[list[LeasedTask], list[LeasedTask]]:
    """(eval leases, training leases)."""
    evals = [lease for lease in leased if lease.task.eval_version is not None]
    return evals, [lease for lease in leased if lease.task.eval_version is None]


def serve_evals(
    engine: InferenceEngine, work: WorkClient, evals: Sequence[LeasedTask], worker_id: str, rollout_key: bytes
) -> int:
    """Decode, sign and answer eval leases with the engine's weights as they are; hand back those it cannot
    answer. Returns the answers the coordinator accepted."""
    version = engine.policy_version
    ready = [lease for lease in evals if lease.task.eval_version == version]
    for lease in evals:
        if lease.task.eval_version != version:
            give_back(work, lease, f"the engine holds version {version} now")
    answers: list[tuple[str, RolloutGroup]] = []
    for lease, result in decode_greedily(engine, ready, worker_id):
        if isinstance(result, EngineError):
            give_back(work, lease, f"{type(result).__name__}: {result}")
        else:
            answers.append((lease.lease_id, sign_rollout(result, rollout_key)))
    if not answers:
        return 0
    reply = work.submit(answers, eval_version=version)
    for refusal in reply.refused:
        log.warning("eval answer for lease %s refused: %s", refusal.lease_id, refusal.reason)
    log.info("answered %d eval tasks of version %d", len(reply.accepted), version)
    return len(reply.accepted)


def decode_greedily(
    engine: InferenceEngine, leased: Sequence[LeasedTask], worker_id: str
) -> list[tuple[LeasedTask, RolloutGroup | EngineError]]:
    """One greedy sample per eval task, in one engine call; after an EngineError, one call per task."""
    if not leased:
        return []
    version, first = engine.policy_version, leased[0].task
    started_s = time.perf_counter()
    try:
        samples = engine.generate(
            [PromptInput.of_task(lease.task) for lease in leased],
            # log-probs at the run's temperature, as the learner's own evaluation takes them
            Sampling(1, first.max_new_tokens, first.temperature, greedy=True),
        )
    except EngineError as exc:
        if len(leased) == 1:
            return [(leased[0], exc)]
        return [outcome for lease in leased for outcome in decode_greedily(engine, [lease], worker_id)]
    generation_s = time.perf_counter() - started_s
    return [
        (lease, build_rollout_group(lease.task, one, worker_id, version, generation_s))
        for lease, one in zip(leased, samples, strict=True)
    ]


def give_back(work: WorkClient, lease: LeasedTask, why: str) -> None:
    log.info("giving back eval task %s of version %s: %s", lease.lease_id, lease.task.eval_version, why)
    work.report_failure(lease.lease_id, why, eval_version=lease.task.eval_version)
