"""Typed wire messages: every payload that crosses a Redis stream is one of these, msgpack-encoded.

Each message carries `schema_version` and `run_id`. Decoding is strict: a payload that is not
msgpack, not a map, has unknown or missing fields, wrong types, or arrays whose lengths disagree
raises `MessageDecodeError` with a reason, which the bus turns into a dead-letter entry.

Token ids and logprobs travel as raw little-endian bytes (int32 / float32), not msgpack int lists:
decoding Python int lists is the measured bottleneck of the bus (docs/design.md#token-arrays-travel-as-raw-bytes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal, Self

import msgpack
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.bounded_msgpack import DecodeLimitError, DecodeLimits, Payload, unpack_bounded

SCHEMA_VERSION: Final = 1

INT32 = np.dtype("<i4")
FLOAT32 = np.dtype("<f4")
UINT8 = np.dtype("u1")


class MessageDecodeError(ValueError):
    """A payload that cannot become the message type it was read as."""


def pack_int32(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=INT32).tobytes()


def pack_float32(values: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=FLOAT32).tobytes()


def unpack_int32(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=INT32)


def unpack_float32(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=FLOAT32)


def pack_mask(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=UINT8).tobytes()


def unpack_mask(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=UINT8)


class Message(BaseModel):
    """Base of every stream payload: strict, immutable, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str = Field(min_length=1, max_length=128)

    def encode(self) -> bytes:
        return msgpack.packb(self.model_dump(mode="python"), use_bin_type=True)

    @classmethod
    def decode(cls, payload: Payload, limits: DecodeLimits | None = None) -> Self:
        """`limits`: for a payload from an untrusted sender (a worker's submission), decoded within them
        (shared/bounded_msgpack.py) so that no payload costs more than they allow; None: our own streams'."""
        try:
            raw = msgpack.unpackb(payload, raw=False) if limits is None else unpack_bounded(payload, limits)
        except DecodeLimitError as exc:
            raise MessageDecodeError(f"{cls.__name__}: {exc}") from exc  # it names the limit
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise MessageDecodeError(f"{cls.__name__}: payload is not msgpack ({exc})") from exc
        if not isinstance(raw, dict):
            raise MessageDecodeError(f"{cls.__name__}: payload is a {type(raw).__name__}, expected a map")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            reasons = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
            )
            raise MessageDecodeError(f"{cls.__name__}: {reasons}") from exc


# "stop": the sample ended with EOS; "length": it hit max_new_tokens.
FinishReason = Literal["stop", "length"]


class ChatMessage(BaseModel):
    """One turn of a chat prompt, as a tokenizer's chat template takes it. Producer: a task adapter
    (via the reward service's TaskGroup). Consumers: rollout workers, the learner's evaluation."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    role: str = Field(min_length=1, max_length=32, description='"system", "user" or "assistant"')
    content: str = Field(max_length=65536)


class EnvironmentSpec(BaseModel):
    """How a worker builds the episode of a multi-turn task (docs/environments.md). Producer: the reward
    service (from an EnvironmentTask's prompt). Consumer: rollout workers, which call the task's
    `make_environment(state)` and drive the episode; the reward service replays it from the same state."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    state: str = Field(min_length=1, max_length=4096, description="what make_environment builds the episode from")
    max_turns: int = Field(ge=1, le=256, description="model turns at most; max_new_tokens is per turn")


class TaskGroup(Message):
    """One prompt to sample a GRPO group for. Producer: reward service (data plane). Consumer: rollout.

    With `environment`, every sample is a multi-turn episode (the prompt is its first observation and
    `max_new_tokens` caps each model turn); without, one completion per sample."""

    task_id: str = Field(min_length=1, max_length=64)
    task_name: str = Field(min_length=1, max_length=64)
    prompt: str = Field(min_length=1, max_length=65536)
    # Chat tasks: the turns the worker renders with its tokenizer's chat template (then `prompt` is
    # their plain form); empty: `prompt` is raw text.
    messages: list[ChatMessage] = Field(default_factory=list, max_length=256)
    num_samples: int = Field(ge=1, le=1024)
    max_new_tokens: int = Field(ge=1, le=65536)
    temperature: float = Field(gt=0.0, le=10.0)
    created_at_s: float = Field(default_factory=time.time)
    # Pull mode (`[schedule] mode = "pull"`): the learner asked for this group at this version; a worker
    # samples it with weights at least this new (it waits for them). 0: any version (async mode).
    min_policy_version: int = Field(0, ge=0)
    environment: EnvironmentSpec | None = None
    # Held-out evaluation (docs/evaluation.md#where-evaluation-runs): an eval task of this policy version. A
    # worker decodes it greedily, one sample, with the weights of exactly this version; its group is scored for
    # the learner's EvalRecord, never trained. None: a training task.
    eval_version: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _eval_task_shape(self) -> Self:
        if self.eval_version is None:
            return self
        if self.num_samples != 1 or self.environment is not None:
            raise ValueError("an eval task has one single-turn sample (greedy decoding)")
        if self.min_policy_version != self.eval_version:
            raise ValueError(f"an eval task of version {self.eval_version} has min_policy_version {self.eval_version}")
        return self


class RolloutGroup(Message):
    """G completions of one prompt. Producer: rollout. Consumer: reward.

    Arrays are raw bytes: `completion_token_ids` (int32) concatenates the samples' tokens in order,
    `completion_lengths` (int32, one per sample) splits it, `behaviour_logprobs` (float32) has one
    entry per completion token: log p(token) under the sampling distribution of `policy_version`.

    Multi-turn episodes (docs/environments.md#the-masked-rollout-format): a sample's completion is the
    model's turns and the environment's observations interleaved, `model turn, observation, model turn,
    ..., model turn`, and `completion_mask` (uint8, one per completion token) says whose each token is:
    1 the model's (trained, behaviour log-prob given), 0 the environment's (never trained; its behaviour
    log-prob is 0.0). Empty means all ones: every single-turn group. Every sample starts and ends with a
    model token. `env_rewards` (one per sample, in [0, 1], or empty) is the return the worker's
    environment gave: informational only, the reward service replays the episode and scores it itself.

    Versions (docs/continuous_batching.md): `policy_version` is the OLDEST version any token of the group
    was sampled with, the one admission judges. A worker that batches continuously lets new weights land
    while samples are in flight: `version_changes` (int32 triples: sample index, completion token index,
    version; sorted) says from which token of which sample on a newer version sampled. Empty: every token
    was sampled with `policy_version` (batch-at-a-time workers). In a masked sample the token index counts
    the observation tokens too; they take the version of the token before them and are never trained.
    """

    group_id: str = Field(min_length=1, max_length=64)
    task_id: str = Field(min_length=1, max_length=64)
    task_name: str = Field(min_length=1, max_length=64)
    prompt: str = Field(min_length=1, max_length=65536)
    worker_id: str = Field(min_length=1, max_length=64)
    policy_version: int = Field(ge=0)
    temperature: float = Field(gt=0.0, le=10.0)
    prompt_token_ids: bytes
    completion_token_ids: bytes
    completion_lengths: bytes
    behaviour_logprobs: bytes
    completion_texts: list[str]
    finish_reasons: list[FinishReason]
    generation_s: float = Field(ge=0.0)
    created_at_s: float = Field(default_factory=time.time)
    # HMAC-SHA256 of the group (this field empty) under the key the coordinator issued `worker_id` at
    # registration (shared/rollout_mac.py); the reward service dead-letters a group whose mac does not match
    producer_mac: bytes = Field(b"", max_length=32)
    completion_mask: bytes = b""
    env_rewards: list[float] = Field(default_factory=list)
    version_changes: bytes = b""

    @model_validator(mode="after")
    def _arrays_agree(self) -> Self:
        for name in ("prompt_token_ids", "completion_token_ids", "completion_lengths", "behaviour_logprobs"):
            if len(getattr(self, name)) % 4:
                raise ValueError(f"{name} has {len(getattr(self, name))} bytes, not a multiple of 4")
        lengths = unpack_int32(self.completion_lengths)
        num_samples = len(lengths)
        if num_samples == 0:
            raise ValueError("a group needs at least one sample")
        if (lengths < 0).any():
            raise ValueError("completion_lengths has a negative length")
        num_tokens = len(self.completion_token_ids) // 4
        if int(lengths.sum()) != num_tokens:
            raise ValueError(f"completion_lengths sum to {int(lengths.sum())} but there are {num_tokens} tokens")
        if len(self.behaviour_logprobs) // 4 != num_tokens:
            raise ValueError(f"{len(self.behaviour_logprobs) // 4} behaviour logprobs for {num_tokens} tokens")
        if len(self.prompt_token_ids) == 0:
            raise ValueError("prompt_token_ids is empty")
        if len(self.completion_texts) != num_samples or len(self.finish_reasons) != num_samples:
            raise ValueError(
                f"{num_samples} samples but {len(self.completion_texts)} texts and {len(self.finish_reasons)} finish reasons"
            )
        if self.completion_mask:
            self._check_mask(lengths, num_tokens)
        if self.version_changes:
            self._check_version_changes(lengths)
        if self.env_rewards:
            if len(self.env_rewards) != num_samples:
                raise ValueError(f"{len(self.env_rewards)} env_rewards for {num_samples} samples")
            if not all(math.isfinite(reward) and 0.0 <= reward <= 1.0 for reward in self.env_rewards):
                raise ValueError("env_rewards must be numbers in [0, 1]")
        return self

    def _check_mask(self, lengths: np.ndarray, num_tokens: int) -> None:
        mask = unpack_mask(self.completion_mask)
        if len(mask) != num_tokens:
            raise ValueError(f"completion_mask has {len(mask)} entries for {num_tokens} completion tokens")
        if (mask > 1).any():
            raise ValueError("completion_mask holds a value other than 0 and 1")
        if (lengths == 0).any():
            raise ValueError("a masked sample has no tokens")
        ends = np.cumsum(lengths)
        starts = ends - lengths
        if not (mask[starts].all() and mask[ends - 1].all()):
            raise ValueError("every masked sample must start and end with a model token (mask 1)")
        if (unpack_float32(self.behaviour_logprobs)[mask == 0] != 0.0).any():
            raise ValueError("behaviour_logprobs must be 0.0 at environment tokens (mask 0)")

    def _check_version_changes(self, lengths: np.ndarray) -> None:
        if len(self.version_changes) % 12:
            raise ValueError(f"version_changes has {len(self.version_changes)} bytes, not int32 triples")
        triples = unpack_int32(self.version_changes).reshape(-1, 3)
        samples, tokens, versions = triples[:, 0], triples[:, 1], triples[:, 2]
        if ((samples < 0) | (samples >= len(lengths))).any():
            raise ValueError("version_changes names a sample the group does not have")
        if ((tokens < 0) | (tokens >= lengths[samples.clip(0, len(lengths) - 1)])).any():
            raise ValueError("version_changes names a token past its sample's end")
        if (versions <= self.policy_version).any():
            raise ValueError(f"version_changes must name versions newer than policy_version {self.policy_version}")
        order = np.lexsort((tokens, samples))
        if (order != np.arange(len(triples))).any():
            raise ValueError("version_changes must be sorted by sample, then token")
        same_sample = samples[1:] == samples[:-1]
        if (same_sample & ((tokens[1:] <= tokens[:-1]) | (versions[1:] <= versions[:-1]))).any():
            raise ValueError("a sample's version changes must move to later tokens and newer versions")
        if set(samples[tokens == 0].tolist()) == set(range(len(lengths))):
            raise ValueError(f"no token was sampled with policy_version {self.policy_version}: it is not the oldest")

    @property
    def num_samples(self) -> int:
        return len(self.completion_lengths) // 4

    def token_versions(self) -> np.ndarray:
        """(num_tokens,) int32: the policy version that sampled each completion token, samples concatenated
        (an environment's token in a masked sample counts as its sample's version there)."""
        lengths = unpack_int32(self.completion_lengths)
        versions = np.full(int(lengths.sum()), self.policy_version, dtype=INT32)
        starts = np.cumsum(lengths) - lengths
        triples = unpack_int32(self.version_changes).reshape(-1, 3)
        for sample, token, version in triples.tolist():  # later changes of a sample overwrite from their token on
            versions[starts[sample] + token : starts[sample] + lengths[sample]] = version
        return versions

    @property
    def newest_version(self) -> int:
        """The newest version any token of the group was sampled with."""
        triples = unpack_int32(self.version_changes).reshape(-1, 3)
        return int(triples[:, 2].max()) if len(triples) else self.policy_version

    def prompt_tokens(self) -> np.ndarray:
        return unpack_int32(self.prompt_token_ids)

    def sample_tokens(self) -> list[np.ndarray]:
        """Per sample: its completion token ids (int32)."""
        return np.split(unpack_int32(self.completion_token_ids), np.cumsum(unpack_int32(self.completion_lengths))[:-1])

    def sample_logprobs(self) -> list[np.ndarray]:
        """Per sample: the behaviour logprob of each completion token (float32)."""
        return np.split(unpack_float32(self.behaviour_logprobs), np.cumsum(unpack_int32(self.completion_lengths))[:-1])

    @property
    def is_masked(self) -> bool:
        """True for multi-turn episodes: some completion tokens are the environment's."""
        return bool(self.completion_mask)

    def sample_masks(self) -> list[np.ndarray]:
        """Per sample: True at the model's completion tokens (all True without a completion_mask)."""
        lengths = unpack_int32(self.completion_lengths)
        if not self.completion_mask:
            return [np.ones(int(length), dtype=bool) for length in lengths]
        return np.split(unpack_mask(self.completion_mask).astype(bool), np.cumsum(lengths)[:-1])


class ScoredGroup(Message):
    """A rollout group with one reward per sample. Producer: reward service. Consumer: learner."""

    rollout: RolloutGroup
    rewards: list[float]
    scored_at_s: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _one_reward_per_sample(self) -> Self:
        if len(self.rewards) != self.rollout.num_samples:
            raise ValueError(f"{len(self.rewards)} rewards for {self.rollout.num_samples} samples")
        if self.rollout.run_id != self.run_id:
            raise ValueError(f"rollout run_id {self.rollout.run_id!r} differs from {self.run_id!r}")
        return self


class WeightsPublished(Message):
    """Announcement that every chunk of `policy_version` can be served. Producer: learner (sent last,
    after the chunks and the manifest exist). Consumers: rollout workers, coordinator."""

    policy_version: int = Field(ge=0)
    manifest_url: str = Field(min_length=1, max_length=2048)
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    total_size_bytes: int = Field(ge=0)
    num_chunks: int = Field(ge=0)
    published_at_s: float = Field(default_factory=time.time)  # serialised, hashed, signed, stored: servable
    # When the learner started publishing this version, right after its optimizer step: the start of
    # the measured T_bcast window (publication included). 0.0: unknown (an older learner), the
    # coordinator then measures from published_at_s.
    publish_started_at_s: float = Field(0.0, ge=0.0)


class DeadLetter(Message):
    """A stream entry that could not be decoded or kept failing. Producer: any consumer. Read by people."""

    source_stream: str
    source_message_id: str
    consumer_group: str
    service: str
    error: str
    payload: bytes
    num_deliveries: int = Field(ge=0)
    failed_at_s: float = Field(default_factory=time.time)


class WorkerMismatch(BaseModel):
    """Engine mismatch of one rollout worker in one step: its behaviour log-probs mu against the learner's
    recomputation pi over the completion tokens of its lag-0 groups (sampled with the very weights the
    learner holds), where the two differ only by the engines' numerics. Producer: learner (in StepRecord
    and LearnerState). Read by people, dashboards and Prometheus."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    num_tokens: int = Field(ge=1, description="lag-0 completion tokens of this worker in the step")
    logprob_abs_diff_mean: float = Field(ge=0.0, description="mean |log mu - log pi| over them, nats")
    kl_k3: float = Field(description="KL(mu || pi), k3 estimator on mu's samples: E[r - 1 - log r], r = pi / mu")


class FlatGroups(BaseModel):
    """The groups of one learner step whose samples all got the same reward ("flat": zero reward variance).
    Their GRPO advantages are all 0 (services/learner/grpo.py), so they add nothing to the gradient; a step
    made only of them changes nothing. Producer: the learner's batch collector (services/learner/batch.py,
    counted by services/learner/zero_variance.py). Consumers: StepRecord (metrics.jsonl), LearnerState,
    Prometheus, the run report."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    num_groups: int = Field(0, ge=0, description="groups the step looked at: trained, plus skipped by dynamic sampling")
    num_flat_at_zero: int = Field(0, ge=0, description="flat groups where every sample scored 0")
    num_flat_at_max: int = Field(0, ge=0, description="flat groups where every sample scored 1, the highest reward")
    num_flat_other: int = Field(0, ge=0, description="flat groups at one reward strictly between 0 and 1")
    num_skipped: int = Field(
        0,
        ge=0,
        description="flat groups that [grpo] dynamic_sampling dropped (reason zero_variance) instead of training",
    )
    num_samples: int = Field(0, ge=0, description="samples of the groups looked at")
    num_samples_cut: int = Field(
        0, ge=0, description="of them, samples that stopped at max_new_tokens (finish 'length')"
    )

    @classmethod
    def total(cls, records: Iterable[FlatGroups]) -> FlatGroups:
        """The counts of several steps together."""
        sums = dict.fromkeys(cls.model_fields, 0)
        for record in records:
            for name in sums:
                sums[name] += getattr(record, name)
        return cls(**sums)

    @property
    def num_flat(self) -> int:
        return self.num_flat_at_zero + self.num_flat_at_max + self.num_flat_other

    @property
    def zero_variance_fraction(self) -> float:
        """Flat groups / groups looked at (0.0 for a step that looked at none)."""
        return self.num_flat / self.num_groups if self.num_groups else 0.0

    @property
    def cut_fraction(self) -> float:
        return self.num_samples_cut / self.num_samples if self.num_samples else 0.0

    @property
    def num_trained(self) -> int:
        return self.num_groups - self.num_skipped

    @property
    def groups_per_trained_group(self) -> float:
        """Dynamic sampling's cost: groups generated (and scored) per group trained on; 1.0 without skips."""
        if self.num_trained == 0:
            return math.inf if self.num_groups else 1.0
        return self.num_groups / self.num_trained


class WorkerTrust(BaseModel):
    """How far the learner trusts one rollout worker (docs/trust.md). Producer: learner (services/learner/trust.py,
    in LearnerState). Consumer: the coordinator, which quarantines a worker whose `suspect` is true."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    score: float = Field(ge=0.0, allow_inf_nan=False, description="running evidence against the worker (CUSUM)")
    suspect: bool = Field(description="score >= the run's trust.quarantine_score")
    num_groups: int = Field(ge=0, description="trained groups checked since the last release")
    num_suspicious: int = Field(ge=0, description="of those, groups whose statistic left the honest band")
    num_audits: int = Field(ge=0, description="exact comparisons at the claimed version (lag 0, or an audit)")
    num_audit_failures: int = Field(
        ge=0, description="of those, groups off by more than the tolerance or failing their provenance check"
    )
    num_provenance_checks: int = Field(0, ge=0, description="audited groups whose keyed sampling was checked")
    num_provenance_failures: int = Field(
        0, ge=0, description="of those, groups whose tokens keyed sampling did not pick"
    )
    num_releases_seen: int = Field(ge=0, description="admin releases applied (each one reset the score)")
    last_statistic_nats: float = Field(
        ge=0.0, allow_inf_nan=False, description="the last group's mean |log mu - log pi|"
    )


@dataclass(frozen=True)
class MetricName:
    """A field's Prometheus name when it is not the field's own (kept so dashboards keep their series)."""

    name: str


class StepDiagnostics(BaseModel):
    """One learner step's loss and off-policy diagnostics, defined here once. Producer: the learner's step
    (services/learner/trainer.py, StepResult.diagnostics). Every StepRecord of metrics.jsonl holds them (it
    extends this class: the same flat fields), LearnerState.last_step carries the last step's, and
    Prometheus shows each field as relayrl_learner_last_<name> (shared/metrics.py), described by its
    description. A new diagnostic is a field here and its line in trainer.step_diagnostics; the rest follows.

    The batch is measured against the behaviour policy mu (the worker's), with pi_prox the weights at the
    step's start; fields with a default are the on-policy value, which metrics.jsonl lines written before
    the field existed read as."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    loss: float = Field(description="the GRPO loss, mean over the step's optimizer updates")
    ratio_mean: float = Field(
        description="pi / mu over completion tokens, before truncation, with pi the weights at the step's start "
        "(pi_prox: equal to is_weight_mean)"
    )
    clip_fraction: float = Field(
        ge=0,
        le=1,
        description="tokens where the PPO clip bound the objective, over every token of every update of the step "
        "(0 with one update per step)",
    )
    truncated_fraction: float = Field(
        ge=0, le=1, description="tokens whose importance weight hit max_importance_weight"
    )
    approx_kl: float = Field(description="KL(behaviour || the weights at the step's start), k3 estimator")
    grad_norm: float = Field(description="gradient norm before clipping, mean over the step's updates")
    num_updates: int = Field(1, ge=1, description="optimizer updates in this step: num_minibatches * ppo_epochs")
    is_weight_mean: Annotated[float, MetricName("importance_weight_mean")] = Field(
        1.0, ge=0, description="importance weight pi_prox / mu over completion tokens, before truncation: mean"
    )
    is_weight_max: Annotated[float, MetricName("importance_weight_max")] = Field(
        1.0, ge=0, description="importance weight pi_prox / mu, before truncation: max"
    )
    ess_fraction: float = Field(
        1.0,
        ge=0,
        le=1,
        description="effective sample size of the importance weights over n completion tokens, "
        "(sum w)^2 / (n sum w^2) in (0, 1]; 1 when on-policy",
    )


# starting: loading / resuming; training: taking steps; done: reached num_steps or max_wall_s.
LearnerStatus = Literal["starting", "training", "done"]


class EvalRecord(BaseModel):
    """One held-out evaluation: a line of metrics.jsonl when it finishes (so it may follow the StepRecords of
    steps taken meanwhile; shared/run_records.py), and the newest one in LearnerState (docs/evaluation.md)."""

    model_config = ConfigDict(extra="forbid")

    eval_step: int = Field(description="learner version evaluated")
    eval_accuracy: float = Field(description="greedy completions scoring exactly 1.0 on the held-out prompts")
    eval_reward_mean: float
    num_eval_prompts: int
    num_verifier_failures: int = Field(
        0, ge=0, description="held-out prompts the verifier timed out, raised or died on (counted as wrong)"
    )
    eval_format_rate: float | None = Field(
        None, description="share of greedy answers in the form the task asks for, right or wrong (None: no form)"
    )
    eval_formatted_accuracy: float | None = Field(None, description="accuracy among the answers in that form")
    eval_chance_accuracy: float | None = Field(
        None, description="the held-out accuracy the answer form alone earns (the task's chance baseline)"
    )
    eval_chance_strategy: str | None = Field(None, description="the format-only strategy that baseline plays")
    evaluated_by: str = Field("learner", description='"learner" (its eval thread) or "workers" (eval tasks)')
    eval_s: float = Field(description="the evaluation's own duration on the eval thread (load weights, decode, score)")
    eval_stall_s: float = Field(
        0.0,
        description="how long the training loop blocked to hand this evaluation over (waiting for the previous "
        "one, snapshotting the weights); 0.0 in records written before evaluation left the loop",
    )
    wall_s: float = Field(description="run time when the evaluation finished")


class LearnerHeadline(BaseModel):
    """What the coordinator's status shows of the learner, declared once: LearnerState extends it, and the
    status's LearnerInfo (shared/api.py) is these fields of the LearnerState it read (LearnerInfo.of). A field
    added here is in both; one added to LearnerState alone stays out of the status."""

    status: LearnerStatus
    learner_version: int = Field(ge=0)
    published_version: int = Field(ge=-1)
    num_steps_target: int = Field(ge=0)
    num_dropped: dict[str, int] = Field(default_factory=dict)
    last_reward_mean: float = 0.0
    busy_fraction: float = 0.0
    last_flat_groups: FlatGroups = Field(
        default_factory=FlatGroups,
        description="the last groups_per_step groups the learner decided (a step's worth; with dynamic sampling "
        "also while a batch does not fill): how many had zero reward variance",
    )
    zero_variance_warning: str | None = Field(
        None,
        max_length=2048,
        description="while 90% or more of each step's groups have been flat for 5 steps in a row "
        "(services/learner/zero_variance.py): the learner's warning, naming the likely cause (the run cannot learn)",
    )
    last_eval: EvalRecord | None = Field(None, description="the newest held-out evaluation (format and chance too)")


class LearnerState(Message, LearnerHeadline):
    """The learner's latest state, kept under one Redis key: LearnerHeadline's fields (what the coordinator's
    status shows) and the rest below. Producer: learner. Consumers: coordinator, the local cluster runner."""

    staleness_bound: int = Field(ge=0)
    last_train_s: float = 0.0
    updated_at_s: float = Field(default_factory=time.time)
    # cumulative over the run (capacity model inputs: the coordinator differences them over a window)
    num_steps_done: int = Field(0, ge=0, description="optimizer steps taken in this run")
    train_s_total: float = Field(0.0, ge=0, description="sum of T_train over those steps")
    idle_s_total: float = Field(0.0, ge=0, description="seconds spent waiting for admissible rollouts")
    wall_s: float = Field(0.0, ge=0, description="run time so far (across restarts)")
    staleness_histogram: dict[str, int] = Field(
        default_factory=dict, description="trained groups by lag t - v over the run (across restarts)"
    )
    token_staleness_histogram: dict[str, int] = Field(
        default_factory=dict,
        description="trained completion tokens by the lag of the version that sampled each, over the run",
    )
    num_groups_trained: int = Field(0, ge=0, description="groups trained on in this run (each counted once)")
    num_dead_lettered: int = Field(0, ge=0, description="groups the learner dead-lettered in this run")
    num_stale_tokens_dropped: int = Field(
        0, ge=0, description="completion tokens not trained because they were too old (dropped groups, masked tokens)"
    )
    num_restarts: int = Field(0, ge=0, description="times the learner resumed from a checkpoint")
    mismatch_by_worker: dict[str, WorkerMismatch] = Field(
        default_factory=dict, description="the last step's engine mismatch by worker id (workers with lag-0 groups)"
    )
    last_step: StepDiagnostics | None = Field(
        None,
        description="the last step's loss and off-policy diagnostics (its StepRecord's); None until this learner "
        "process has taken a step",
    )
    trust_by_worker: dict[str, WorkerTrust] = Field(
        default_factory=dict, description="every worker whose groups the learner trained on: its trust (docs/trust.md)"
    )


class BatchRequest(Message):
    """Pull mode: the groups the learner still needs for its next step, all to be sampled with version
    `policy_version` (published before it asks). Producer: learner, rewritten as its batch fills.
    Consumer: the reward service, which issues that many tasks minus those already in flight."""

    policy_version: int = Field(ge=0)
    num_groups_wanted: int = Field(ge=0, description="groups_per_step minus the groups admitted so far")
    num_groups_skipped: int = Field(
        0,
        ge=0,
        description="[grpo] dynamic_sampling: groups of this version dropped so far for zero reward variance; "
        "the feed may issue that many beyond groups_per_step to replace them",
    )
    requested_at_s: float = Field(default_factory=time.time)


class QuarantinedWorkers(Message):
    """The workers the coordinator quarantined, and how often an admin released each. Producer: coordinator
    (services/coordinator/quarantine.py). Consumer: the learner, which drops their groups (reason
    `quarantined`) and resets a worker's score when its release count grows."""

    worker_ids: list[str] = Field(default_factory=list, description="quarantined now")
    num_releases: dict[str, int] = Field(default_factory=dict, description="admin releases by worker id")
    updated_at_s: float = Field(default_factory=time.time)


class EvalRequest(Message):
    """Evaluate `policy_version` on the task's held-out prompts with the rollout workers. Producer: learner
    (services/learner/worker_eval.py). Consumer: reward service (services/reward/evaluation.py), which issues one
    eval task per held-out prompt, leased only to workers whose engine holds exactly that version."""

    request_id: str = Field(min_length=1, max_length=64, description="the learner's id of this evaluation")
    policy_version: int = Field(ge=0)
    deadline_s: float = Field(gt=0, description="seconds after requested_at_s at which the reward service gives up")
    requested_at_s: float = Field(default_factory=time.time)


class EvalScore(BaseModel):
    """One held-out prompt's greedy completion, scored. Producer: reward service (in EvalScores)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    prompt_index: int = Field(ge=0, description="its place in the task's eval_set")
    completion_text: str = Field(max_length=1 << 20, description="the text the completion's token ids decode to")
    reward: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="the verifier's (0.0 when it failed)")
    verifier_failed: bool = Field(description="the verifier timed out, raised, died or returned no valid reward")
    worker_id: str = Field(min_length=1, max_length=64, description="the worker that generated it")


class EvalScores(Message):
    """The workers' evaluation of one version, complete: one score per held-out prompt. Producer: reward service
    (services/reward/evaluation.py), once every prompt of the request is scored. Consumer: learner
    (services/learner/worker_eval.py), which turns it into the version's EvalRecord."""

    request_id: str = Field(min_length=1, max_length=64)
    policy_version: int = Field(ge=0)
    requested_at_s: float
    first_leased_at_s: float | None = Field(description="when a worker first leased one of its tasks (None: unknown)")
    finished_at_s: float = Field(description="when its last prompt was scored")
    scores: list[EvalScore] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_score_per_prompt(self) -> Self:
        indices = sorted(score.prompt_index for score in self.scores)
        if indices != list(range(len(self.scores))):
            raise ValueError("scores must hold prompt indices 0..n-1, each once")
        return self
