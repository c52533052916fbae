"""REST bodies of the control plane: capacity, activation, cost, the dashboard's aggregate (pydantic only).

Producer: the coordinator (services/coordinator/control.py, control_routes.py). Consumers: operators,
the dashboard page, the local cluster runner. Infinite quantities are sent as null.
"""

from __future__ import annotations

from pydantic import Field

from services.coordinator.schemas import Body, LearnerInfo, WorkerInfo


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
    usd_by_worker: dict[str, float]
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
