"""The data plane's consumer side: turn a rollout group into a scored group with the task's verifier.

The reward is the verifier's score of the text the *token ids* decode to (services/reward/decode.py),
because the ids are what the learner trains on (and the prompt ids must encode the task's prompt, or a
right answer to the task would train the model to give it to another prompt); the worker's own text only serves to count workers
whose text disagrees with their ids (`text_mismatches_by_worker`). The verifier runs in a child process
under a hard timeout (shared/verifier_pool.py).

Multi-turn tasks (an EnvironmentTask, docs/environments.md): the model's turns are decoded from the ids
where the mask says model, and the child replays them in a fresh environment built from the task's
state (the stored reference): the replay's return is the reward, whatever the worker's `env_rewards`
say (a disagreement is counted per worker, `env_reward_mismatches_by_worker`); the ids where the mask
says environment must be the replayed observations as the tokenizer encodes them, else the group is
dead-lettered (a worker cannot make the model train on observations the environment never showed).
"""

from __future__ import annotations

import logging
from collections import Counter

import redis

from services.reward.decode import CompletionDecoder, InvalidTokensError
from shared.bus import redis_text
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

    def __init__(
        self, task_name: str, decoder: CompletionDecoder, verifiers: VerifierPool, max_turns: int | None = None
    ) -> None:
        self.task_name = task_name
        self.max_turns = max_turns  # an EnvironmentTask's turn limit: its groups are replayed; None: single-turn
        self.decoder = decoder
        self.verifiers = verifiers
        self.text_mismatches_by_worker: Counter[str] = Counter()  # samples whose text differs from their ids
        self.verifier_failures_by_kind: Counter[str] = Counter()  # groups failed: timeout, raised, died, bad_reward
        # groups dead-lettered, by (worker id, rejection_reason): what a worker's bad input cost it
        self.rejected_by_worker: Counter[tuple[str, str]] = Counter()
        self.env_reward_mismatches_by_worker: Counter[str] = (
            Counter()
        )  # samples whose claimed return was not the replay's

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
            None if value is None else redis_text(value)
            for value in redis_client.mget([keys.task_reference(group.task_id), keys.task_prompt(group.task_id)])
        )
        if reference is None:
            raise UnscorableGroupError(f"no reference for task {group.task_id} (never issued by this run, or expired)")
        if prompt is not None:
            self.decoder.check_prompt(group, prompt)
        if self.max_turns is not None:
            return ScoredGroup(
                run_id=group.run_id, rollout=group, rewards=self.replay(group, reference, self.max_turns)
            )
        if group.is_masked:
            raise UnscorableGroupError(f"group {group.group_id} is multi-turn (masked), task {self.task_name!r} is not")
        texts = self.decoder.decode(group)
        self.count_mismatches(group, texts)
        try:
            rewards = self.verifiers.score(texts, reference)
        except VerifierFailedError as exc:
            self.verifier_failures_by_kind[exc.kind] += 1
            raise
        return ScoredGroup(run_id=group.run_id, rollout=group, rewards=rewards)

    def replay(self, group: RolloutGroup, state: str, max_turns: int) -> list[float]:
        """The rewards of a multi-turn group: its episodes replayed from `state` (module docstring)."""
        episodes = self.decoder.decode_episodes(group, max_turns)
        self.count_mismatches(group, [episode.text for episode in episodes])
        try:
            replays = self.verifiers.replay(state, [episode.actions for episode in episodes])
        except VerifierFailedError as exc:
            self.verifier_failures_by_kind[exc.kind] += 1
            raise
        for index, (episode, replayed) in enumerate(zip(episodes, replays, strict=True)):
            expected = [self.decoder.encode_observation(text) for text in replayed.observations]
            if episode.observation_ids != expected:
                raise InvalidTokensError(
                    f"sample {index}: its environment tokens are not the observations the replay shows"
                )
        rewards = [replay.reward for replay in replays]
        if group.env_rewards:
            num_mismatches = sum(
                abs(claimed - reward) > 1e-6 for claimed, reward in zip(group.env_rewards, rewards, strict=True)
            )
            if num_mismatches:
                self.env_reward_mismatches_by_worker[group.worker_id] += num_mismatches
        return rewards

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
