"""The coordinator's REST contract: every request and response body (pydantic; no FastAPI import, so
clients use the same classes as the server).

Producer: the coordinator (services/coordinator/). Consumers: rollout workers (register, heartbeat,
staleness, parent), operators and the tooling in cluster/ and simulator/ (status, workers, relay plan,
capacity, cost, dashboard). Infinite quantities are sent as null.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from shared.config import ModelConfig
from shared.messages import LearnerHeadline, LearnerState, WeightsPublished, WorkerTrust
from shared.time_use import TimeUse

# Bounds of what a client may send: far above any real value, far below what overflows the control
# computations (a swap time of 1e308 once made every control pass raise OverflowError).
MAX_VERSION = 2**31 - 1
MAX_COUNT = 2**53  # exact in a float
MAX_RATE_PER_S = 1e9
MAX_DURATION_S = 86_400.0
MAX_UNIX_TIME_S = 1e10  # the year 2286
MAX_TOTAL_S = 1e9  # a running total of seconds (~32 years)
MAX_BYTES = 2**50


# A worker proves it may join the run with the cluster's join token in this header (POST /v1/workers).
JOIN_TOKEN_HEADER = "X-RL-Join-Token"
# GET /v1/status lists this many workers at most (live first): ~600 bytes each, so it stays under 64 KiB
# however many identities registered; GET /v1/workers pages through the rest
STATUS_MAX_WORKERS = 50
MAX_WORKERS_PAGE = 1000


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestBody(Body):
    """What a client sends: finite numbers only (NaN, +-Infinity and 1e999, which JSON parsers turn into
    inf, are refused with 422 naming the field) and bounded ones (the bounds above)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _utf8_encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate escape ("\ud800") parses as JSON but is no text
        raise ValueError("not valid UTF-8 text (a lone surrogate?)") from exc
    return text


Text = Annotated[str, AfterValidator(_utf8_encodable)]


class WorkerState(StrEnum):
    ACTIVE = "active"  # leased and generating (or allowed to)
    DEAD = "dead"  # lease expired; must register again
    STANDBY = "standby"  # leased, keeps its weights fresh, takes no tasks (cost-aware activation)
    DRAINING = "draining"  # finishing its current batch, then it deregisters and exits
    QUARANTINED = "quarantined"  # its trust score crossed the threshold: no tasks, no relay, until an admin releases it


class RegisterWorkerRequest(RequestBody):
    name: Text = Field("worker", min_length=1, max_length=64, description="human-readable label")
    endpoint_url: Text = Field("", max_length=512, description="the worker's own chunk-server base URL (empty: none)")
    gpu_type: Text = Field("cpu", min_length=1, max_length=64, description="accelerator kind")
    price_per_hour: float = Field(0.0, ge=0, le=10000, description="what the worker costs, $/h")
    bandwidth_mbps: float = Field(1000.0, gt=0, le=1e6, description="link speed the worker reports, Mbit/s")
    region: Text = Field("local", min_length=1, max_length=64, description="where it runs")
    previous_worker_id: Text | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="rejoining after its lease ran out: the id it had (with 'Authorization: Bearer <its token>')",
    )


class WorkerAccess(Body):
    """What a worker is issued at registration besides its token (services/coordinator/redis_access.py):
    `rollout_key_hex` signs its rollouts (shared/rollout_mac.py). Workers hold no Redis credentials: they
    take tasks and hand back groups through the coordinator's work API (shared/work_api.py)."""

    rollout_key_hex: str = Field(min_length=64, max_length=64, description="HMAC-SHA256 key for producer_mac, hex")


class RegisterWorkerResponse(Body):
    worker_id: str
    token: str = Field(description="bearer token for this worker's own calls")
    run_id: str
    lease_s: float
    heartbeat_interval_s: float
    staleness_bound: int
    state: WorkerState = Field(
        WorkerState.ACTIVE, description="active: take tasks; standby: wait (heartbeats say when)"
    )
    rejoined: bool = Field(False, description="true: the previous_worker_id's record was revived (same id, totals)")
    access: WorkerAccess = Field(description="this worker's rollout-signing key")


# Where a worker started with only the coordinator's URL and the join token fetches the rest (`relay-rl worker`).
BOOTSTRAP_PATH = "/v1/cluster/bootstrap"


class ClusterBootstrap(Body):
    """GET /v1/cluster/bootstrap (header X-RL-Join-Token): everything a worker on another machine needs
    besides the coordinator's URL and the join token (a worker needs no Redis: it works through the
    coordinator's work API). Producer: the coordinator, from its RL_RUN_CONFIG, RL_RUN_ID and
    RL_WEIGHTS_PUBLIC_KEY. Consumer: `relay-rl worker` (cluster/remote_worker.py), which writes
    `run_config_toml` to its work folder, builds or checks the model folder `model` describes, and starts
    services.rollout.

    The public key travels over the same HTTP as the rest: trust on first use unless the worker pins it
    (`relay-rl worker --public-key HEX`); with TLS in front of the coordinator it is as good as the link."""

    run_id: str = Field(min_length=1, description="the run's id (RL_RUN_ID, else the run file's run_id)")
    run_config_toml: str = Field(
        min_length=1, description="the run file as the coordinator read it (`extends` resolved), TOML text"
    )
    weights_public_key: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="the learner's Ed25519 public key (hex of 32 bytes)"
    )
    model: ModelConfig = Field(
        description="the run file's [model]: init = tiny-random is built by the worker, a catalog model fetched"
    )


class ReleaseResponse(Body):
    """An admin released a quarantined worker (docs/trust.md)."""

    worker_id: str
    state: WorkerState = Field(description="active again, or dead when its lease ran out while quarantined")
    num_releases: int = Field(ge=1, description="releases of this worker so far (the learner resets its score)")


class WeightSwapReport(RequestBody):
    """A worker's account of its latest weight swap: the input of the measured T_bcast and rollout pause.

    On the worker's clock: ready_at_s <= swapped_at_s (the verified weights wait for the group in flight,
    then the engine loads them for pause_s, then samples with them)."""

    policy_version: int = Field(ge=0, le=MAX_VERSION, description="the version now loaded in the engine")
    announced_at_s: float = Field(
        ge=0, le=MAX_UNIX_TIME_S, description="unix time the learner announced it (WeightsPublished.published_at_s)"
    )
    swapped_at_s: float = Field(ge=0, le=MAX_UNIX_TIME_S, description="unix time the engine started sampling with it")
    num_bytes: int = Field(ge=0, le=MAX_BYTES, description="bytes this worker downloaded for it")
    source_url: Text = Field("", max_length=512, description="where the chunks came from (parent, holder or learner)")
    pause_s: float | None = Field(
        None,
        ge=0,
        le=MAX_DURATION_S,
        description="the rollout pause: seconds the engine spent loading these weights, not generating (null: unknown)",
    )
    ready_at_s: float | None = Field(
        None,
        ge=0,
        le=MAX_UNIX_TIME_S,
        description="unix time the verified weights were ready to load (null: unknown); at most swapped_at_s",
    )
    parent_url: Text = Field(
        "",
        max_length=512,
        description="the relay parent the coordinator assigned for this version (the first source asked; '': not told)",
    )
    parent_bytes: int = Field(
        0, ge=0, le=MAX_BYTES, description="bytes of num_bytes that came from parent_url (its delivery, as observed)"
    )

    @model_validator(mode="after")
    def _ready_before_swap(self) -> Self:
        if self.ready_at_s is not None and self.ready_at_s > self.swapped_at_s:
            raise ValueError("ready_at_s is after swapped_at_s: weights are loaded after they are ready")
        if self.parent_bytes > self.num_bytes:
            raise ValueError("parent_bytes exceeds num_bytes: the parent cannot have sent more than was downloaded")
        return self


class HeartbeatRequest(RequestBody):
    policy_version: int = Field(
        -1, ge=-1, le=MAX_VERSION, description="version the worker's engine holds (-1: none yet)"
    )
    num_groups_done: int = Field(
        0, ge=0, le=MAX_COUNT, description="groups published since registration (the worker's own view: never stored)"
    )
    num_samples_done: int = Field(
        0, ge=0, le=MAX_COUNT, description="samples published since registration (the worker's own view: never stored)"
    )
    samples_per_s: float = Field(0.0, ge=0, le=MAX_RATE_PER_S, description="recent generation throughput")
    generating: bool = Field(False, description="false while gated (stale) or waiting for work")
    tokens_per_s: float = Field(
        0.0, ge=0, le=MAX_RATE_PER_S, description="recent completion tokens per second of generation time"
    )
    group_latency_s: float = Field(
        0.0, ge=0, le=MAX_DURATION_S, description="L_gen: mean seconds of one engine call (a batch of groups)"
    )
    last_swap: WeightSwapReport | None = Field(None, description="the most recent weight swap, if any")
    # where its time went since it registered (shared/time_use.py; its own claim, a diagnosis only)
    generating_s_total: float = Field(0.0, ge=0, le=MAX_TOTAL_S, description="seconds generating")
    gated_s_total: float = Field(0.0, ge=0, le=MAX_TOTAL_S, description="seconds held by the staleness gate")
    waiting_for_tasks_s_total: float = Field(0.0, ge=0, le=MAX_TOTAL_S, description="seconds with no task")


class HeartbeatResponse(Body):
    state: WorkerState
    lease_expires_at_s: float
    learner_version: int
    staleness_bound: int


class WorkerInfo(Body):
    worker_id: str
    name: str
    state: WorkerState
    endpoint_url: str
    gpu_type: str
    price_per_hour: float
    bandwidth_mbps: float
    region: str
    policy_version: int
    num_groups_done: int = Field(description="groups the work API accepted from it (counted there, not claimed)")
    num_samples_done: int = Field(description="samples in those groups")
    samples_per_s: float
    generating: bool
    tokens_per_s: float = 0.0
    group_latency_s: float = 0.0
    generating_s_total: float = Field(0.0, description="its heartbeat's claim: seconds generating since registering")
    gated_s_total: float = Field(0.0, description="its heartbeat's claim: seconds held by the staleness gate")
    waiting_for_tasks_s_total: float = Field(0.0, description="its heartbeat's claim: seconds with no task to lease")
    state_since_s: float = Field(0.0, description="unix time of the last state change")
    registered_at_s: float
    last_heartbeat_s: float
    lease_expires_at_s: float
    num_rollouts_forged: int = Field(
        0, description="rollouts claiming this worker whose producer_mac did not verify (dead-lettered)"
    )
    operator_id: str = Field(
        "", description="the join credential it registered with (GET /v1/operators); empty: the cluster's shared token"
    )
    inbound_reachable: bool | None = Field(
        None,
        description="the coordinator's connect-back probe reached its chunk server (false: behind NAT or a "
        "firewall, a leaf of the relay plan; null: not probed yet, or probing is off; "
        "services/coordinator/reachability.py)",
    )


class StalenessResponse(Body):
    policy_version: int
    learner_version: int
    staleness_bound: int
    admissible: bool = Field(description="a group sampled now with policy_version may still be trained on")
    steps_remaining: int = Field(description="learner steps until it stops being admissible (negative: too old)")


class LearnerInfo(Body, LearnerHeadline):
    """The learner in the status: its LearnerState's headline fields (shared/messages.py LearnerHeadline, declared
    there once for both)."""

    @classmethod
    def of(cls, state: LearnerState) -> Self:
        return cls(**{name: getattr(state, name) for name in LearnerHeadline.model_fields})


class StatusResponse(Body):
    run_id: str
    staleness_bound: int
    learner: LearnerInfo | None
    stream_depths: dict[str, int] = Field(description="entries not yet finished by their consumers, per stream")
    num_dead_letters: int
    workers: list[WorkerInfo] = Field(
        description=f"the live workers, then the most recently dead, {STATUS_MAX_WORKERS} at most (GET /v1/workers "
        "pages through all of them)"
    )
    num_workers_by_state: dict[str, int] = Field(
        default_factory=dict, description="every registered worker the coordinator still knows, by state"
    )
    cost_usd: float = Field(0.0, description="cumulative cost so far (GET /v1/cost for the breakdown)")
    time_use: TimeUse | None = Field(
        None, description="where the time went and the side bounding the run (shared/time_use.py); None: no learner"
    )


# Weight broadcast (services/coordinator/routers/broadcast.py). Consumers: rollout workers (their parent),
# operators and the run report (the plan, measured T_bcast).


class RelayAssignmentInfo(Body):
    worker_id: str
    name: str
    parent_id: str = Field(description='"learner" or the id of the worker to fetch from')
    parent_url: str = Field(description="chunk server to fetch from (the learner's, when known)")
    depth: int = Field(ge=1, description="hops from the learner (1: a seed)")
    reported_mbps: float
    measured_mbps: float | None = Field(None, description="throughput achieved on past versions, if measured")
    fallback_urls: list[str] = Field(description="holders to use when the parent dies or stalls, best first")
    inbound_reachable: bool | None = Field(
        None, description="the coordinator's probe reached its chunk server (false or null: a leaf, nobody's parent)"
    )


class RelayPlanResponse(Body):
    learner_url: str = Field(description="the learner's chunk server, from the newest announcement ('' before any)")
    num_seeds: int
    fanout: int
    max_depth: int
    assignments: list[RelayAssignmentInfo] = Field(description="every active or standby worker, fastest first")


class ParentResponse(Body):
    """Where one worker fetches the next version from; asked again whenever its parent fails."""

    worker_id: str
    parent_id: str = Field(description='"learner" or a worker id')
    parent_url: str = Field(
        description="the chunk server to stream from ('' : the learner, use the announcement's URL)"
    )
    depth: int = Field(ge=1)
    fallback_urls: list[str] = Field(description="other holders, best first; the learner is always the last resort")
    learner_url: str = Field(description="the learner's chunk server, from the newest announcement ('' before any)")


class BroadcastSplits(Body):
    """One version's T_bcast taken apart, and the rollout pause its swaps cost (null: not known, e.g. a
    version measured before these were recorded, or workers that do not report them)."""

    publish_s: float | None = Field(
        description="learner: publication start -> announced (serialise, hash, sign, store)"
    )
    transfer_s: float | None = Field(description="announced -> the last counted worker's swap (T_bcast - publish_s)")
    ready_s: float | None = Field(
        description="publication start -> the verified weights ready in the last counted worker (before the swap, "
        "which waits for the group in flight and the load)"
    )
    pause_mean_s: float | None = Field(description="rollout pause: mean seconds an engine spent loading the version")
    pause_max_s: float | None = Field(description="rollout pause: the longest over the counted workers")
    num_paused: int = Field(0, ge=0, description="counted workers that reported their pause for this version")


T_BCAST_WINDOW = "learner publish start -> engine sampling with the version"
T_BCAST_WINDOW_ANNOUNCED = "learner announcement -> engine sampling with the version"  # coordinators before it


class BroadcastTimesResponse(Body):
    seconds_by_version: dict[int, float] = Field(
        description="T_bcast: the learner's publication start (announcement time for older learners) to the last "
        "active worker's swap"
    )
    num_versions: int
    mean_s: float | None
    max_s: float | None
    last_s: float | None = Field(description="T_bcast of the newest measured version")
    window: str = Field(
        T_BCAST_WINDOW_ANNOUNCED,
        description=f"what T_bcast measures: {T_BCAST_WINDOW!r} (absent: an older coordinator)",
    )
    splits_by_version: dict[int, BroadcastSplits] = Field(
        default_factory=dict, description="per version: publication, transfer, readiness and the rollout pause"
    )
    pause_mean_s: float | None = Field(None, description="rollout pause: mean over every counted swap reported")
    pause_max_s: float | None = Field(None, description="rollout pause: the longest counted swap")


# Control plane: capacity, activation, cost, the dashboard's aggregate. Producer: the coordinator
# (services/coordinator/control.py); consumers: operators, the dashboard page, the local cluster runner.
class CapacityInputsInfo(Body):
    samples_per_step: int = Field(description="R = group_size * groups_per_step")
    train_s: float = Field(description="T_train: measured mean optimizer step time")
    step_overhead_s: float = Field(description="publish + eval + checkpoint per step (wall - train - idle)")
    broadcast_s: float = Field(description="T_bcast: mean of the newest measured broadcasts (0 when none yet)")
    group_latency_s: float = Field(description="L_gen: the slowest active worker's batch latency")
    queue_delay_s: float = Field(description="D: how long finished groups wait before the learner reads them")
    publish_every: int = Field(description="k")
    staleness_bound: int = Field(description="S")
    worker_samples_per_s: dict[str, float] = Field(description="mu_i of the active workers, by worker id")
    sources: dict[str, str] = Field(description="where each input came from")


class CapacityResponse(Body):
    known: bool = Field(description="false until the learner has reported a step time (then only inputs are shown)")
    required_samples_per_s: float | None = Field(description="throughput rule: R / T_train")
    overlap_required_samples_per_s: float | None = Field(
        description="overlap form: k*R / (k*T_train - T_bcast); null: infeasible"
    )
    provisioning_samples_per_s: float | None = Field(description="what activation provisions for (before its margin)")
    current_samples_per_s: float = Field(description="sum of the active workers' measured samples/s")
    predicted_step_s: float | None = Field(description="P*: predicted seconds per learner step; null: no throughput")
    predicted_utilization: float | None = Field(description="T_train / P*: predicted busy share of the learner")
    measured_utilization: float | None = Field(description="train / wall over the same window the inputs cover")
    max_lag_steps: int | None = Field(description="largest t - v of a group read at P* (exact discrete form)")
    min_feasible_staleness: int | None = Field(description="k + ceil((T_bcast + L_gen + D) / C)")
    staleness_feasible: bool | None = Field(description="a learner that never waits trains on every group at this S")
    admissible_fraction: float | None = Field(description="share of generated groups that arrive admissible at P*")
    starved: bool | None = Field(description="throughput is below what keeps the learner from waiting")
    inputs: CapacityInputsInfo | None


class ActivationInfo(Body):
    enabled: bool
    target_samples_per_s: float | None = Field(description="required * (1 + margin); null: requirement unknown")
    planned_samples_per_s: float = Field(description="measured or estimated throughput of the active set")
    planned_price_per_hour: float = Field(description="$/h of the active workers")
    active_worker_ids: list[str]
    standby_worker_ids: list[str]
    estimated_samples_per_s: dict[str, float] = Field(
        description="throughput used per worker (measured, else estimated)"
    )
    reason: str
    planned_at_s: float


class CostResponse(Body):
    total_usd: float
    learner_usd: float
    workers_usd: float
    usd_by_worker: dict[str, float] = Field(
        description="each worker's billed cost: its active time backed by verified work"
    )
    unverified_usd: float = Field(
        0.0,
        description="workers' active time not billed: no scored group within the verified-work window, or flagged "
        "(services/coordinator/ledger.py)",
    )
    usd_per_hour_now: float = Field(
        description="current burn rate: learner (while running) + active and draining workers"
    )
    learner_price_per_hour: float
    billed_until_s: float


class HistoryPoint(Body):
    learner_version: int
    reward_mean: float
    utilization: float = Field(description="the learner's busy fraction so far")
    cost_usd: float
    at_s: float


class DashboardResponse(Body):
    run_id: str
    learner: LearnerInfo | None
    staleness_bound: int
    workers: list[WorkerInfo]
    staleness_histogram: dict[str, int]
    stream_depths: dict[str, int]
    history: list[HistoryPoint]
    capacity: CapacityResponse
    activation: ActivationInfo | None
    cost: CostResponse
    trust_by_worker: dict[str, WorkerTrust] = Field(
        default_factory=dict, description="the learner's trust per worker id (docs/trust.md)"
    )
    time_use: TimeUse | None = Field(None, description="where the time went (shared/time_use.py); None: no learner")


# GET WEIGHTS_LATEST_PATH (services/coordinator/routers/weights.py): the learner's newest announcement,
# a shared.messages.WeightsPublished as JSON, once it is news to the caller (`is_news`), else 204 after
# at most `wait_s` <= MAX_WEIGHTS_WAIT_S. Consumer: rollout workers (services/rollout/announcement_client.py).
WEIGHTS_LATEST_PATH = "/v1/weights/latest"
MAX_WEIGHTS_WAIT_S = 10.0


def is_news(announcement: WeightsPublished, after_version: int, after_sha256: str | None) -> bool:
    """Whether `announcement` is news to a reader holding version `after_version` (-1: none) announced
    with manifest `after_sha256` (None: unknown): a higher version, or, the sha256 given, any other
    manifest (a learner resumed from an older checkpoint announces lower or re-used versions)."""
    if after_sha256 is None:
        return announcement.policy_version > after_version
    return announcement.manifest_sha256 != after_sha256


# Join credentials (services/coordinator/operators.py, routers/operators.py): an admin issues one per operator
# (or per worker) and revokes it; quarantine sticks to it. Producer: the coordinator. Consumers: admins
# (`relay-rl operators`, cluster/operators.py). A worker sends its credential's join_token in JOIN_TOKEN_HEADER.
OPERATORS_PATH = "/v1/operators"


class OperatorState(StrEnum):
    ACTIVE = "active"  # registers workers
    QUARANTINED = "quarantined"  # one of its workers is quarantined: registers nobody until an admin releases it
    REVOKED = "revoked"  # an admin revoked it: registers nobody, ever; its live workers were drained


class CredentialBudget(Body):
    """What one join credential may hold and do (services/coordinator/credential_budget.py): the run file's
    [credentials] defaults unless an admin set its own."""

    max_workers: int = Field(ge=1, le=1_000_000, description="live identities it may hold at once")
    max_leases: int = Field(ge=1, le=1_000_000, description="task leases its identities may hold together")
    registrations_per_min: float = Field(gt=0, le=1e7, description="registrations and rejoins per minute")


class CredentialBudgetUpdate(RequestBody):
    """PATCH /v1/operators/{id} (admin): the fields to change; absent ones stay as they are."""

    max_workers: int | None = Field(None, ge=1, le=1_000_000)
    max_leases: int | None = Field(None, ge=1, le=1_000_000)
    registrations_per_min: float | None = Field(None, gt=0, le=1e7)


class IssueOperatorRequest(RequestBody):
    name: Text = Field(min_length=1, max_length=64, description="whom the credential is for (a label; not unique)")
    budget: CredentialBudgetUpdate | None = Field(None, description="its own budget (absent: the run's defaults)")


class WorkCounts(Body):
    """The work API's counters of a worker or a credential (named by shared/work_counts.py WorkCounter and read by
    its read_work_counts), plus the leases held now (for the closing identity) and what the reward service made of
    the accepted groups. Served by the work accounting (shared/work_api.py) and the operator records; the rows of
    the accounting CLI (cluster/accounting.py) are these too."""

    leased: int = Field(0, ge=0)
    returned: int = Field(0, ge=0)
    accepted: int = Field(0, ge=0)
    refused: int = Field(0, ge=0)
    expired: int = Field(0, ge=0)
    failed: int = Field(0, ge=0)
    held: int = Field(0, ge=0, description="leases held now, not yet answered nor expired and reissued")
    scored: int = Field(0, ge=0, description="of its accepted groups, those the reward service scored")
    rejected: int = Field(0, ge=0, description="of its accepted groups, those the reward service dead-lettered")

    @property
    def num_unaccounted(self) -> int:
        """leased - (accepted + failed + expired + held): 0 when every lease is accounted for."""
        return self.leased - (self.accepted + self.failed + self.expired + self.held)

    @property
    def num_decided(self) -> int:
        """Leases that ended: answered, failed or expired."""
        return self.accepted + self.failed + self.expired

    @property
    def num_judged(self) -> int:
        """Leases whose outcome is known: the answer scored or refused by the reward service, or the lease failed
        or expired. An accepted answer the reward service has not judged yet is in neither part."""
        return self.scored + self.rejected + self.failed + self.expired

    @property
    def completion_ratio(self) -> float | None:
        """Of the judged leases, the fraction answered with a group the reward service scored (None: none
        judged yet). An answer counts as completed only once it is scored: well-formed garbage the work API
        accepts and the reward service refuses counts against its worker."""
        return self.scored / self.num_judged if self.num_judged else None


class CredentialRecord(WorkCounts):
    """What the work API saw of one credential's identities together (services/coordinator/credential_record.py):
    their leases and how they ended, their groups scored and refused by the reward service (`held`: leases its
    identities hold now), and what it has earned."""

    allowance: float = Field(0.0, ge=0, description="leases it has earned the right to hold at once")
    share: int | None = Field(
        None, description="its part of the in-flight window by verified throughput (null: none set)"
    )


class OperatorInfo(Body):
    operator_id: str
    name: str
    state: OperatorState
    created_at_s: float = Field(description="unix time it was issued")
    revoked_at_s: float | None = Field(None, description="unix time an admin revoked it (null: not revoked)")
    quarantined_worker_ids: list[str] = Field(
        default_factory=list, description="its workers now quarantined; each one's release clears it"
    )
    quarantine_reason: str | None = Field(
        None, description="why the credential itself is quarantined (its record, over all its identities)"
    )
    worker_ids: list[str] = Field(default_factory=list, description="its live identities (registered, lease running)")
    budget: CredentialBudget | None = Field(None, description="what it may hold and do")
    record: CredentialRecord | None = Field(None, description="its identities' work together")


class IssuedOperator(Body):
    """POST /v1/operators: the credential and its join token, shown once (only its sha256 is stored)."""

    operator: OperatorInfo
    join_token: str = Field(description=f"what its workers send in header {JOIN_TOKEN_HEADER} (RL_JOIN_TOKEN)")


class RevokedOperator(Body):
    """DELETE /v1/operators/{id}: the credential as it is now, and the workers the revocation drained."""

    operator: OperatorInfo
    drained_worker_ids: list[str] = Field(description="its active or standby workers, now draining")
