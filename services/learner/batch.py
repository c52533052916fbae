"""From the `scored` stream to a training batch: collect admissible groups, then tensorize them.

Every group read is decided exactly once, at the learner's current version t:
- another run's group: dropped (run_mismatch), acked at once;
- a quarantined worker's group: dropped (quarantined), acked at once (docs/trust.md);
- token ids outside the vocabulary, longer than the model's context, or non-finite logprobs or
  rewards: dead-lettered with the reason (acked with its dead letter) - a broken worker must not
  crash or poison the learner;
- t - v > S or v > t: dropped (stale / future_version), acked at once; it is counted, never trained on;
- `[grpo] dynamic_sampling` on and every sample of the group got the same reward: dropped
  (zero_variance), acked at once: its advantages are all 0, it would train nothing (zero_variance.py);
  the collector reads on until the batch is full;
- otherwise admitted. An admitted group stays pending in the consumer group until the checkpoint
  that covers its training step is on disk (the learner acks it then).

Every group that passes the admission rule is counted in the batch's FlatGroups (trained or skipped),
the learner's per-step view of groups with zero reward variance.

After a restart the groups this consumer had admitted but not acked (bus.read_own_pending) come
first, and are decided again at the restored version.

A drop or a dead letter is final when it is made (the entry is acked: nobody sees it again), so its
count is kept in Redis (RunKeys.learner_decisions), incremented atomically with the ack; a restarted
learner continues those counts (`restore_decisions`) instead of the older ones of its checkpoint.

Every `trim_interval_s` the collector trims `scored` below the oldest entry still pending (the learner
is the stream's only consumer: what it acked is gone for good, shared/stream_trim.py), so a long run's
Redis holds the groups in flight, not every group ever scored.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from services.learner.grpo import group_advantages
from services.learner.zero_variance import FlatGroupTally
from shared.bus import Delivery, StreamBus
from shared.flat_groups import is_flat
from shared.keys import DEAD_LETTERED, RunKeys
from shared.messages import FlatGroups, RolloutGroup, ScoredGroup, unpack_float32, unpack_int32
from shared.retry import call_with_retry
from shared.staleness import AdmissionRule, DropReason, admission_verdict, max_trained_token_lag, staleness_of
from shared.stream_trim import TRIM_INTERVAL_S, ConsumedTrimmer
from shared.streams import SCORED

log = logging.getLogger(__name__)

LEARNER_CONSUMER = "learner-0"


class InvalidGroupError(ValueError):
    """A scored group the learner cannot train on whatever its version: it is dead-lettered."""


@dataclass(frozen=True)
class AdmittedGroup:
    delivery: Delivery[ScoredGroup]
    staleness: int  # t - v at admission
    replayed: bool  # re-read from this consumer's pending entries after a restart

    @property
    def group(self) -> ScoredGroup:
        return self.delivery.message


@dataclass(frozen=True)
class CollectedBatch:
    groups: list[AdmittedGroup]
    idle_s: float  # wall seconds spent collecting: waiting for admissible rollouts (plus ms of decoding)
    flat_groups: FlatGroups  # zero-variance groups among those admitted or skipped by dynamic sampling

    @property
    def message_ids(self) -> list[str]:
        return [admitted.delivery.message_id for admitted in self.groups]


class BatchCollector:
    """Reads `scored` for the learner's consumer and applies the admission rule."""

    def __init__(
        self,
        bus: StreamBus,
        keys: RunKeys,
        *,
        staleness_bound: int,
        groups_per_step: int,
        vocab_size: int,
        max_positions: int,
        scored_block_ms: int = 500,
        dynamic_sampling: bool = False,
        trim_interval_s: float = TRIM_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        admission: AdmissionRule = "per_token",
    ) -> None:
        self.bus = bus
        self.keys = keys
        self.staleness_bound = staleness_bound
        self.admission = admission
        self.groups_per_step = groups_per_step
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.scored_block_ms = scored_block_ms
        self.dynamic_sampling = dynamic_sampling
        self._window = FlatGroupTally()  # groups past the admission rule since the last on_window call
        self.num_dropped: Counter[str] = Counter()  # cumulative, by DropReason value (restore_decisions)
        # tokens not trained for their age, by each one's own lag: every token of a group dropped as stale,
        # and (per_token admission) the tokens masked out of admitted groups (`note_masked`). Under
        # oldest_token admission, those at lag <= S are what per_token admission would have trained.
        self.stale_token_lags: Counter[int] = Counter()
        self.num_dead_lettered = 0
        self.quarantined: frozenset[str] = frozenset()  # worker ids whose groups are dropped (trust_monitor.py)
        self._replay: deque[Delivery[ScoredGroup]] = deque()
        self._held: set[str] = set()  # admitted by this process, not yet acked by the learner
        self._reply_maybe_lost = False
        self.trimmer = ConsumedTrimmer(bus, (SCORED,), interval_s=trim_interval_s, clock=clock)

    def ensure_group(self) -> None:
        call_with_retry(lambda: self.bus.ensure_group(SCORED), "create consumer group")

    def load_own_pending(self) -> int:
        """Queue the entries delivered to this consumer and never acked that this process does not
        hold: after a restart, the groups admitted before the crash; after a Redis outage, those a
        lost read reply delivered unseen. They are decided (again) before anything new is read.
        Every re-read counts as a delivery: the bus dead-letters an entry after `max_deliveries`
        (a group that keeps killing the learner). Returns how many were queued."""
        pending = call_with_retry(
            lambda: self.bus.read_own_pending(SCORED, LEARNER_CONSUMER, count=1_000_000),
            "read own pending",
        )
        known = self._held | {delivery.message_id for delivery in self._replay}
        unseen = [delivery for delivery in pending if delivery.message_id not in known]
        self._replay.extend(unseen)
        return len(unseen)

    def restore_decisions(self, checkpointed_dropped: dict[str, int], checkpointed_dead_lettered: int) -> None:
        """Continue the drop and dead-letter counts after a restart: Redis holds every decision up to the
        crash; the checkpoint's (older) counts matter only if Redis lost its data (no AOF). The larger
        of the two per reason, written back so Redis and this process count on from the same totals."""
        stored = call_with_retry(lambda: self.bus.counts(self.keys.learner_decisions), "read decision counts")
        merged = {
            reason: max(stored.get(reason, 0), checkpointed_dropped.get(reason, 0))
            for reason in {*stored, *checkpointed_dropped} - {DEAD_LETTERED}
        }
        dead_lettered = max(stored.get(DEAD_LETTERED, 0), checkpointed_dead_lettered)
        self.num_dropped = Counter({reason: count for reason, count in merged.items() if count})
        self.num_dead_lettered = dead_lettered
        mapping = {**merged, DEAD_LETTERED: dead_lettered}
        call_with_retry(lambda: self.bus.put_counts(self.keys.learner_decisions, mapping), "write decision counts")

    def release(self, message_ids: list[str]) -> None:
        """The learner acked these (their checkpoint is on disk): no longer held by this process."""
        self._held.difference_update(message_ids)

    def collect(
        self,
        learner_version: int,
        should_stop: Callable[[], bool],
        on_wanted: Callable[[int, int], None] | None = None,
        on_window: Callable[[FlatGroups], None] | None = None,
    ) -> CollectedBatch | None:
        """Block until `groups_per_step` groups are admitted at `learner_version`; None when
        `should_stop()` turns true first (the partial batch stays pending and is re-read on restart).
        `on_wanted(n, k)` hears how many groups are still missing and how many were skipped as flat so
        far, first and whenever either changes (pull mode asks the data plane for them).
        `on_window(flat)` hears the flat groups of every groups_per_step groups that pass the admission
        rule (trained or skipped), across batches: a step's worth each, without dynamic sampling exactly
        one step; with it, also while a batch does not fill because every group is skipped."""
        started_s = time.monotonic()
        admitted: list[AdmittedGroup] = []
        tally = FlatGroupTally()
        if on_wanted is not None:
            on_wanted(self.groups_per_step, 0)
        while len(admitted) < self.groups_per_step:
            if should_stop():
                return None
            num_before = (len(admitted), tally.counts["num_skipped"])
            for delivery, replayed in self._next_deliveries(self.groups_per_step - len(admitted)):
                if not self.admit(delivery, learner_version):
                    continue
                group = delivery.message
                skipped = self.dynamic_sampling and is_flat(group.rewards)
                if skipped:
                    self._drop(delivery, DropReason.ZERO_VARIANCE)
                else:
                    lag = staleness_of(learner_version, group.rollout.policy_version)
                    admitted.append(AdmittedGroup(delivery, lag, replayed))
                    self._held.add(delivery.message_id)
                tally.add(group, skipped=skipped)
                self._count_in_window(group, skipped, on_window)
            if on_wanted is not None and (len(admitted), tally.counts["num_skipped"]) != num_before:
                on_wanted(self.groups_per_step - len(admitted), tally.counts["num_skipped"])
        return CollectedBatch(admitted, idle_s=time.monotonic() - started_s, flat_groups=tally.record())

    def _count_in_window(
        self, group: ScoredGroup, skipped: bool, on_window: Callable[[FlatGroups], None] | None
    ) -> None:
        self._window.add(group, skipped=skipped)
        if self._window.counts["num_groups"] == self.groups_per_step:
            if on_window is not None:
                on_window(self._window.record())
            self._window = FlatGroupTally()

    def admit(self, delivery: Delivery[ScoredGroup], learner_version: int) -> bool:
        """Decide one group at `learner_version`; drops and dead letters are recorded (and acked) here."""
        group = delivery.message
        if group.run_id != self.keys.run_id:
            self._drop(delivery, DropReason.RUN_MISMATCH)
            return False
        if group.rollout.worker_id in self.quarantined:
            self._drop(delivery, DropReason.QUARANTINED)
            return False
        try:
            validate_group(group, self.vocab_size, self.max_positions)
        except InvalidGroupError as exc:  # policy: a group we cannot train on goes to the dead letters
            error = f"learner: {exc}"
            tally = (self.keys.learner_decisions, DEAD_LETTERED)
            call_with_retry(lambda: self.bus.dead_letter(delivery, error, tally=tally), "dead-letter")
            self.num_dead_lettered += 1
            return False
        rollout = group.rollout
        reason = admission_verdict(
            learner_version,
            rollout.policy_version,
            self.staleness_bound,
            newest_version=rollout.newest_version,
            rule=self.admission,
        )
        if reason is not None:
            if reason == DropReason.STALE:
                self.stale_token_lags.update(group_token_lags(rollout, learner_version))
            self._drop(delivery, reason)
            return False
        return True

    def oldest_trained_version(self, learner_version: int) -> int | None:
        """The oldest version whose tokens the step at `learner_version` trains (per_token admission masks the
        older ones); None: every token of an admitted group (oldest_token admission)."""
        max_lag = max_trained_token_lag(self.admission, self.staleness_bound)
        return None if max_lag is None else learner_version - max_lag

    def note_masked(self, groups: list[AdmittedGroup], learner_version: int) -> None:
        """per_token admission: count the tokens of admitted groups too old to train (tensorize masks them)."""
        for admitted in groups:
            lags = group_token_lags(admitted.group.rollout, learner_version)
            self.stale_token_lags.update({lag: n for lag, n in lags.items() if lag > self.staleness_bound})

    def _drop(self, delivery: Delivery[ScoredGroup], reason: DropReason) -> None:
        # Acked at once: the effect of a drop is only its count, kept in Redis with the ack.
        key = self.keys.learner_decisions
        call_with_retry(lambda: self.bus.ack_and_count(SCORED, delivery.message_id, key, reason.value), "ack drop")
        self.num_dropped[reason.value] += 1
        log.debug(
            "dropped group %s (v%d): %s",
            delivery.message.rollout.group_id,
            delivery.message.rollout.policy_version,
            reason,
        )

    def _next_deliveries(self, count: int) -> list[tuple[Delivery[ScoredGroup], bool]]:
        if self._reply_maybe_lost:
            self._reply_maybe_lost = False
            if num_recovered := self.load_own_pending():
                log.warning("%d scored groups delivered during a redis outage were recovered", num_recovered)
        if self._replay:
            return [(self._replay.popleft(), True) for _ in range(min(count, len(self._replay)))]
        call_with_retry(self.trimmer.trim_if_due, "trim scored")  # frees memory even at maxmemory
        deliveries = call_with_retry(
            lambda: self.bus.read(SCORED, LEARNER_CONSUMER, count=count, block_ms=self.scored_block_ms),
            "read scored",
            on_retry=self._note_lost_reply,
        )
        return [(delivery, False) for delivery in deliveries]

    def _note_lost_reply(self) -> None:
        # A read whose reply was lost to a dropped connection left its entries pending for this
        # consumer without this process seeing them; without a re-read they would wait for the
        # next restart while the learner starves.
        self._reply_maybe_lost = True


def validate_group(group: ScoredGroup, vocab_size: int, max_positions: int) -> None:
    """Raise InvalidGroupError unless every token fits the model and every number is finite."""
    rollout = group.rollout
    prompt = rollout.prompt_tokens()
    completion = unpack_int32(rollout.completion_token_ids)
    for name, ids in (("prompt", prompt), ("completion", completion)):
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise InvalidGroupError(f"{name} token ids outside [0, {vocab_size}): {int(ids.min())}..{int(ids.max())}")
    longest = len(prompt) + max(len(sample) for sample in rollout.sample_tokens())
    if longest > max_positions:
        raise InvalidGroupError(f"prompt + completion is {longest} tokens, the model holds {max_positions}")
    logprobs = unpack_float32(rollout.behaviour_logprobs)
    if not np.isfinite(logprobs).all():
        raise InvalidGroupError("behaviour logprobs contain NaN or inf")
    # Multi-turn: the decoded message already holds a well-formed mask (RolloutGroup._check_mask); a sample
    # with no model token would train nothing and weigh in the group's advantages as if it had.
    if rollout.is_masked and any(not mask.any() for mask in rollout.sample_masks()):
        raise InvalidGroupError("a sample has no model token (completion_mask all 0)")
    if not np.isfinite(group.rewards).all():
        raise InvalidGroupError("rewards contain NaN or inf")


@dataclass(frozen=True)
class TrainBatch:
    """One optimizer step's data: B = total samples, right-padded to the longest prompt + completion T."""

    input_ids: torch.Tensor  # (B, T) long, prompt + completion + padding
    attention_mask: torch.Tensor  # (B, T) long, 0 on padding
    # (B, T - 1) bool, True where target token j + 1 is a completion token the model sampled (multi-turn:
    # never at the environment's observation tokens, which condition the model but are not its actions)
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor  # (B, T - 1) float, the worker's logprobs at the completion targets
    advantages: torch.Tensor  # (B, 1) float, one per sample, shared by its tokens
    temperatures: torch.Tensor  # (B,) float, the temperature each sample was drawn at
    rewards: torch.Tensor  # (B,) float
    # (B, T - 1) bool, the completion tokens the loss trains: completion_mask less the tokens too old to
    # train under per_token admission (shared/staleness.py). None: all of completion_mask. The trust
    # checks compare every sampled token (completion_mask); the loss sees these (`loss_mask`).
    trained_mask: torch.Tensor | None = None

    @property
    def num_samples(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.completion_mask if self.trained_mask is None else self.trained_mask

    def map(self, change: Callable[[torch.Tensor], torch.Tensor]) -> TrainBatch:
        """The batch with `change` applied to every tensor (rows taken, a device moved to)."""
        return TrainBatch(
            input_ids=change(self.input_ids),
            attention_mask=change(self.attention_mask),
            completion_mask=change(self.completion_mask),
            behaviour_logprobs=change(self.behaviour_logprobs),
            advantages=change(self.advantages),
            temperatures=change(self.temperatures),
            rewards=change(self.rewards),
            trained_mask=None if self.trained_mask is None else change(self.trained_mask),
        )

    def to(self, device: torch.device) -> TrainBatch:
        """The same batch on `device` (itself when it is there already)."""
        if self.input_ids.device == device:
            return self
        return self.map(lambda tensor: tensor.to(device))

    @property
    def num_tokens(self) -> int:
        """Completion tokens the loss trains."""
        return int(self.loss_mask.sum().item())


def token_lags(groups: list[AdmittedGroup], learner_version: int, max_lag: int | None = None) -> dict[str, int]:
    """Completion tokens by lag: `learner_version` minus the version that sampled each; with `max_lag`, only
    those at most that old (the ones trained: tensorize masks the others out)."""
    counts: Counter[int] = Counter()
    for admitted in groups:
        counts.update(group_token_lags(admitted.group.rollout, learner_version))
    return lag_counts(Counter({lag: n for lag, n in counts.items() if max_lag is None or lag <= max_lag}))


def lag_counts(counts: Counter[int]) -> dict[str, int]:
    """A histogram by lag as records keep it: string keys, in lag order."""
    return {str(lag): counts[lag] for lag in sorted(counts)}


def group_token_lags(rollout: RolloutGroup, learner_version: int) -> dict[int, int]:
    """One group's completion tokens by lag (the model's tokens only: an environment's observation is not
    sampled)."""
    versions = rollout.token_versions()
    if rollout.is_masked:
        versions = versions[np.concatenate(rollout.sample_masks())]
    lags, num_tokens = np.unique(learner_version - versions, return_counts=True)
    return dict(zip(lags.tolist(), num_tokens.tolist(), strict=True))


def tensorize(
    groups: list[ScoredGroup],
    pad_token_id: int,
    normalize_advantage_by_std: bool,
    oldest_trained_version: int | None = None,
) -> TrainBatch:
    """Lay the groups' samples out as rows of one right-padded batch, with per-sample advantages. Tokens
    sampled by a version older than `oldest_trained_version` are masked out of the loss (per_token
    admission, shared/staleness.py); None trains every model token."""
    rows = [row for group in groups for row in sample_rows(group.rollout, oldest_trained_version)]
    padded = pad_rows(rows, pad_token_id)
    advantages = [
        group_advantages(torch.tensor(group.rewards, dtype=torch.float32), normalize_advantage_by_std)
        for group in groups
    ]
    return TrainBatch(
        input_ids=padded.input_ids,
        attention_mask=padded.attention_mask,
        completion_mask=padded.completion_mask,
        behaviour_logprobs=padded.behaviour_logprobs,
        advantages=torch.cat(advantages)[:, None],
        temperatures=torch.tensor([row.temperature for row in rows], dtype=torch.float32),
        rewards=torch.tensor([reward for group in groups for reward in group.rewards], dtype=torch.float32),
        trained_mask=None if oldest_trained_version is None else padded.trained_mask,
    )


@dataclass(frozen=True)
class SampleRow:
    """One sample as a row of the batch, before padding."""

    token_ids: np.ndarray  # (P + C,) the prompt, then the completion
    start: int  # P: index of the first completion token
    behaviour_logprobs: np.ndarray  # (C,) float, the worker's logprob of each completion token
    model_mask: np.ndarray  # (C,) bool, True at the model's tokens (multi-turn: not the observations)
    fresh_mask: np.ndarray  # (C,) bool, True at the model's tokens new enough to train
    temperature: float


def sample_rows(rollout: RolloutGroup, oldest_trained_version: int | None) -> list[SampleRow]:
    """A group's samples as rows, in sample order; tokens of versions older than `oldest_trained_version` are not
    fresh (None: every model token is)."""
    prompt = rollout.prompt_tokens()
    masks = rollout.sample_masks()
    fresh = masks
    if oldest_trained_version is not None and rollout.policy_version < oldest_trained_version:
        new_enough = rollout.token_versions() >= oldest_trained_version
        ends = np.cumsum([len(mask) for mask in masks])
        fresh = [mask & part for mask, part in zip(masks, np.split(new_enough, ends[:-1]), strict=True)]
    return [
        SampleRow(np.concatenate([prompt, tokens]), len(prompt), logprobs, model_mask, fresh_mask, rollout.temperature)
        for tokens, logprobs, model_mask, fresh_mask in zip(
            rollout.sample_tokens(), rollout.sample_logprobs(), masks, fresh, strict=True
        )
    ]


@dataclass(frozen=True)
class PaddedRows:
    """The rows right-padded to the longest, T: TrainBatch's token-level tensors."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    completion_mask: torch.Tensor  # (B, T - 1) bool
    trained_mask: torch.Tensor  # (B, T - 1) bool
    behaviour_logprobs: torch.Tensor  # (B, T - 1) float


def pad_rows(rows: list[SampleRow], pad_token_id: int) -> PaddedRows:
    """The rows, right-padded with `pad_token_id`, their completion values at the targets that predict them."""
    num_rows, max_len = len(rows), max(len(row.token_ids) for row in rows)
    input_ids = torch.full((num_rows, max_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((num_rows, max_len), dtype=torch.long)
    completion_mask = torch.zeros((num_rows, max_len - 1), dtype=torch.bool)
    trained_mask = torch.zeros((num_rows, max_len - 1), dtype=torch.bool)
    behaviour_logprobs = torch.zeros((num_rows, max_len - 1), dtype=torch.float32)
    for i, row in enumerate(rows):
        start, end = row.start, len(row.token_ids)
        input_ids[i, :end] = torch.from_numpy(row.token_ids.astype(np.int64))
        attention_mask[i, :end] = 1
        # Target position j - 1 holds token j, so completion tokens [start, end) sit at [start - 1, end - 1);
        # of those, only the model's own tokens are trained (observations stay False).
        completion_mask[i, start - 1 : end - 1] = torch.from_numpy(row.model_mask)
        trained_mask[i, start - 1 : end - 1] = torch.from_numpy(row.fresh_mask)
        behaviour_logprobs[i, start - 1 : end - 1] = torch.from_numpy(row.behaviour_logprobs.astype(np.float32))
    return PaddedRows(input_ids, attention_mask, completion_mask, trained_mask, behaviour_logprobs)
