"""The data plane's consumer side: turn a rollout group into a scored group with the task's verifier.

The reward is the verifier's score of the text the *token ids* decode to (services/reward/decode.py),
because the ids are what the learner trains on (and the prompt ids must encode the task's prompt, or a
right answer to the task would train the model to give it to another prompt); the worker's own text only serves to count workers
whose text disagrees with their ids (`text_mismatches_by_worker`). The verifier runs in a child process
under a hard timeout (shared/verifier_pool.py).
"""

from __future__ import annotations

import logging
from collections import Counter

import redis

from services.reward.decode import CompletionDecoder, InvalidTokensError
from shared.keys import RunKeys
from shared.messages import RolloutGroup, ScoredGroup
from shared.verifier_pool import VerifierFailedError, VerifierPool

log = logging.getLogger(__name__)


class UnscorableGroupError(ValueError):
    """A rollout this service cannot score (unknown task, wrong task name): dead-lettered with the reason."""


# Everything a bad group can raise while it is scored; the service dead-letters it with the reason.
UNSCORABLE_ERRORS = (UnscorableGroupError, InvalidTokensError, VerifierFailedError)


class GroupScorer:
    """Scores groups of one task: checks, decodes, verifies. Keeps the counters /metrics shows."""

    def __init__(self, task_name: str, decoder: CompletionDecoder, verifiers: VerifierPool) -> None:
        self.task_name = task_name
        self.decoder = decoder
        self.verifiers = verifiers
        self.text_mismatches_by_worker: Counter[str] = Counter()  # samples whose text differs from their ids
        self.verifier_failures_by_kind: Counter[str] = Counter()  # groups failed: timeout, raised, died, bad_reward
        # groups dead-lettered, by (worker id, rejection_reason): what a worker's bad input cost it
        self.rejected_by_worker: Counter[tuple[str, str]] = Counter()

    def score(self, group: RolloutGroup, redis_client: redis.Redis, keys: RunKeys) -> ScoredGroup:
        """The scored group; raises one of UNSCORABLE_ERRORS (counted against the group's worker)."""
        try:
            return self.check_and_score(group, redis_client, keys)
        except UNSCORABLE_ERRORS as exc:
            self.rejected_by_worker[(group.worker_id, rejection_reason(exc))] += 1
            raise

    def check_and_score(self, group: RolloutGroup, redis_client: redis.Redis, keys: RunKeys) -> ScoredGroup:
        if group.task_name != self.task_name:
            raise UnscorableGroupError(
                f"group {group.group_id} is for task {group.task_name!r}, this run scores {self.task_name!r}"
            )
        reference, prompt = (
            as_text(value)
            for value in redis_client.mget([keys.task_reference(group.task_id), keys.task_prompt(group.task_id)])
        )
        if reference is None:
            raise UnscorableGroupError(f"no reference for task {group.task_id} (never issued by this run, or expired)")
        if prompt is not None:
            self.decoder.check_prompt(group, prompt)
        texts = self.decoder.decode(group)
        self.count_mismatches(group, texts)
        try:
            rewards = self.verifiers.score(texts, reference)
        except VerifierFailedError as exc:
            self.verifier_failures_by_kind[exc.kind] += 1
            raise
        return ScoredGroup(run_id=group.run_id, rollout=group, rewards=rewards)

    def count_mismatches(self, group: RolloutGroup, decoded: list[str]) -> None:
        num_mismatches = sum(claimed != text for claimed, text in zip(group.completion_texts, decoded, strict=True))
        if num_mismatches:
            if not self.text_mismatches_by_worker[group.worker_id]:  # once per worker; /metrics counts the rest
                log.warning(
                    "worker %s sent texts that its token ids do not decode to (group %s): scoring the decoded text",
                    group.worker_id,
                    group.group_id,
                )
            self.text_mismatches_by_worker[group.worker_id] += num_mismatches


def rejection_reason(exc: Exception) -> str:
    """The /metrics label of a dead-lettered group: unscorable, invalid_tokens or verifier_<kind>."""
    if isinstance(exc, VerifierFailedError):
        return f"verifier_{exc.kind}"
    return "invalid_tokens" if isinstance(exc, InvalidTokensError) else "unscorable"


def as_text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
